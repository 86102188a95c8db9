#pragma once
// towerflow::io: safetensors files (with tensor checksums), atomic writes, checkpoint directories,
// module state, CRC-32C, the train_dir lock.
#include "io/atomic_file.h"
#include "io/checkpoint_dir.h"
#include "io/crc32c.h"
#include "io/model_state.h"
#include "io/safetensors.h"
#include "io/train_dir_lock.h"
