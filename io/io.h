#pragma once
// towerflow::io: safetensors files, atomic writes, checkpoint directories, module state.
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/model_state.h"
#include "io/safetensors.h"
