#pragma once
// towerflow data: datasets (CIFAR-10/100 binary, image folders, a built-in synthetic set),
// augmentation, and the prefetching loader that turns them into NHWC float batches.

#include "data/augment.h"
#include "data/batch.h"
#include "data/builtin.h"
#include "data/cifar.h"
#include "data/dataset.h"
#include "data/image_codec.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/open.h"
#include "data/resized.h"
#include "data/subset.h"
#include "data/views.h"
