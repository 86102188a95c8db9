#pragma once
// towerflow's run loop: fit() (epochs, evaluation, checkpoints, resume), its hooks, and the hooks
// an application installs to show and record a run (Reporter, MetricsFile).
#include "train/checkpoint.h"
#include "train/fit.h"
#include "train/hook.h"
#include "train/lookahead.h"
#include "train/metrics_file.h"
#include "train/monitor.h"
#include "train/records.h"
#include "train/reporter.h"
#include "train/startup.h"
#include "train/step_window.h"
#include "train/stop_on_signal.h"
#include "train/tensorboard.h"
#include "train/time_left.h"
#include "train/trace.h"
