#pragma once
// Which towerflow a program was built from: the version ("0.1.0") and the git commit the build was
// configured at ("3f2a9c1d0e4b"; "unknown" for a source tree without git history, unless the build
// was configured with -DTOWERFLOW_COMMIT=...). Shown by --version and in the start-up block, and
// recorded in every checkpoint's metadata (towerflow_version, towerflow_commit).

#include <string>

namespace towerflow {

const char* version();
const char* commit();
std::string version_string();  // "towerflow 0.1.0 (commit 3f2a9c1d0e4b)"

}  // namespace towerflow
