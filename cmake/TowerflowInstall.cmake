# Installed layout: lib/libtowerflow_*.a, include/towerflow/<area>/*.h, lib/cmake/towerflow/.
# Filled in by the embedding work (find_package(towerflow) + towerflow::towerflow).
