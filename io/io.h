#pragma once
// towerflow::io: safetensors files, atomic writes, checkpoint directories.
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors.h"
