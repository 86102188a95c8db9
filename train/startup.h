#pragma once
// The start-up description of a run (what the reporter prints before the first step): a titled
// block of key/value lines (the model, data, towers, devices and what each kind computes with, as
// its backend says, the batch split, optimizer, length, checkpoints), and the same run's shape as
// JSON facts for machine readers.

#include <string>
#include <utility>
#include <vector>

#include "data/augment.h"
#include "train/hook.h"

namespace towerflow::train {

// A titled block's key/value lines (start-up, summary), in order.
using Fields = std::vector<std::pair<std::string, std::string>>;
// Sets `key` to `value`: in place if present, else inserted after `after` (or at the end).
void set_field(Fields& fields, const std::string& key, std::string value, const std::string& after = {});

// The start-up block's fields for a run.
Fields start_fields(const StartInfo& start);
// The run's shape as one JSON object: "towerflow" {version, commit}, "run" {run_id, towers,
// processes, global_batch, rows_per_tower, accumulation_steps, total_steps, steps_per_epoch,
// epochs, start_step, resumed_from, parameters, num_classes, train_examples, test_examples,
// val_examples} and "metadata" (what the checkpoints record; a value that is a JSON object, such
// as cifar10_train's options, as an object).
std::string start_facts(const StartInfo& start);

// "random crops of the image padded by 4, horizontal flips, cutout 12x12", or "none".
std::string describe_augment(const data::Augment& a, const data::MixOptions& mix = {});
// "(x/255 - mean) / std per channel, mean (0.4914, 0.4822, 0.4465), std (...) (CIFAR-10's)".
std::string describe_normalisation(const data::Augment& a);

}  // namespace towerflow::train
