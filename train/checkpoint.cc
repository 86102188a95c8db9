#include "train/checkpoint.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "io/model_state.h"

#include <nlohmann/json.hpp>

namespace towerflow::train {
namespace fs = std::filesystem;
namespace {

std::int64_t metadata_int(const io::SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end())
    raise<DataError>("checkpoint file ", f.source(), " lacks the metadata field \"", key,
                     "\" (not a towerflow training checkpoint, or a damaged one)");
  std::int64_t v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0)
    raise<DataError>("checkpoint file ", f.source(), ": metadata field \"", key, "\" is \"", s,
                     "\", expected a non-negative integer");
  return v;
}

CheckpointInfo info_of(const io::SafetensorsFile& state) {
  CheckpointInfo info;
  info.metadata = state.metadata();
  info.position.step = metadata_int(state, "step");
  info.position.epoch = metadata_int(state, "epoch");
  info.position.step_in_epoch = metadata_int(state, "step_in_epoch");
  metadata_int(state, "optimizer_step");
  return info;
}

// One note per checkpoint without checksums (see checkpoint.h).
void note_unchecked(const fs::path& checkpoint, const io::SafetensorsFile& model, const io::SafetensorsFile& state) {
  if (model.checksummed() && state.checksummed()) return;
  log_info(str("checkpoint ", checkpoint.string(), " carries no tensor checksums (written before towerflow recorded "
               "them); its bytes cannot be verified; checkpoints written from now on carry them"));
}

// The parameter shape of each optimizer state tensor: "<slot>.<state>" has the slot's shape.
io::Shape state_shape(const optim::Optimizer& optimizer, const optim::NamedState& s) {
  for (const auto& slot : optimizer.parameters().slots)
    if (s.name.size() > slot.name.size() + 1 && s.name.starts_with(slot.name) && s.name[slot.name.size()] == '.' &&
        s.name.find('.', slot.name.size() + 1) == std::string::npos && slot.size == s.values.size())
      return slot.shape;
  return {static_cast<std::int64_t>(s.values.size())};
}

// The loss scaler's state as train_state's metadata, and back (checkpoint.h).
void save_loss_scale(const tower::LossScaler& scaler, io::Metadata& meta) {
  const tower::LossScaleState s = scaler.state();
  meta["loss_scale"] = str(std::setprecision(17), s.scale);
  meta["loss_scale_good_steps"] = std::to_string(s.good_steps);
  meta["loss_scale_skipped_steps"] = std::to_string(s.skipped_steps);
}

// The state a checkpoint records, nullopt for none; DataError for values that are not numbers.
std::optional<tower::LossScaleState> recorded_loss_scale(const io::Metadata& meta, const fs::path& checkpoint) {
  const auto scale = meta.find("loss_scale");
  if (scale == meta.end()) return std::nullopt;
  auto number = [&](const char* key) -> std::string {
    const auto it = meta.find(key);
    return it == meta.end() ? "0" : it->second;
  };
  try {
    const tower::LossScaleState s{.scale = std::stod(scale->second),
                                  .good_steps = std::stoll(number("loss_scale_good_steps")),
                                  .skipped_steps = std::stoll(number("loss_scale_skipped_steps"))};
    if (s.scale > 0 && std::isfinite(s.scale) && s.good_steps >= 0 && s.skipped_steps >= 0)
      return s;  // what LossScaler::load_state accepts
  } catch (const std::logic_error&) {  // std::stod's invalid_argument / out_of_range
  }
  raise<DataError>("checkpoint ", checkpoint.string(), ": its loss scale metadata ('", scale->second,
                     "', good steps '", number("loss_scale_good_steps"), "', skipped '",
                     number("loss_scale_skipped_steps"),
                     "') is not a positive scale with counts >= 0; the checkpoint is damaged: resume from an earlier one");
}

}  // namespace

fs::path save_checkpoint(io::CheckpointDir& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                         const TrainingPosition& position, const io::Metadata& metadata, int keep,
                         const tower::LossScaler* loss_scaler, const std::vector<optim::NamedState>& hook_tensors) {
  auto model_state = io::module_state(model);
  std::vector<io::TensorView> model_views;
  model_views.reserve(model_state.size());
  for (const auto& h : model_state) model_views.push_back(h.view());
  io::Metadata model_meta{{"format", "pt"}, {"step", std::to_string(position.step)}};
  std::string model_bytes = io::serialize_safetensors(model_views, io::with_checksums(model_views, model_meta));

  optim::OptimizerState state = optimizer.state();
  std::vector<io::TensorView> views;
  views.reserve(state.tensors.size());
  for (const auto& s : state.tensors)
    views.push_back({s.name, io::DType::F32, state_shape(optimizer, s), std::as_bytes(std::span(s.values))});
  io::Metadata meta = metadata;
  meta["step"] = std::to_string(position.step);
  meta["epoch"] = std::to_string(position.epoch);
  meta["step_in_epoch"] = std::to_string(position.step_in_epoch);
  meta["optimizer_step"] = std::to_string(state.step);
  meta["optimizer"] = optimizer.name();
  // The update counts of slots a frozen parameter group held back (OptimizerState::slot_steps).
  if (!state.slot_steps.empty()) meta["optimizer_slot_steps"] = nlohmann::json(state.slot_steps).dump();
  if (loss_scaler) save_loss_scale(*loss_scaler, meta);  // so that a resumed run goes on alike
  std::string state_bytes = io::serialize_safetensors(views, io::with_checksums(views, std::move(meta)));

  std::vector<std::pair<std::string, std::string>> files{{kModelFile, std::move(model_bytes)},
                                                         {kStateFile, std::move(state_bytes)}};
  if (!hook_tensors.empty()) {
    std::vector<io::TensorView> hook_views;
    for (const auto& t : hook_tensors)
      hook_views.push_back({t.name, io::DType::F32, {static_cast<std::int64_t>(t.values.size())},
                            std::as_bytes(std::span(t.values))});
    files.emplace_back(kHookStateFile, io::serialize_safetensors(hook_views, io::with_checksums(hook_views, {})));
  }
  return dir.save(position.step, files, keep);
}

std::vector<optim::NamedState> load_hook_tensors(const fs::path& checkpoint) {
  if (!fs::exists(checkpoint / kHookStateFile)) return {};
  auto file = io::SafetensorsFile::load(checkpoint / kHookStateFile);  // verifies the checksums
  std::vector<optim::NamedState> out;
  for (const auto& e : file.entries()) {
    if (e.dtype != io::DType::F32)
      raise<DataError>("checkpoint file ", file.source(), ": hook tensor \"", e.name, "\" is ",
                       io::to_string(e.dtype), ", expected F32");
    auto bytes = file.data(e);
    optim::NamedState t{e.name, std::vector<float>(bytes.size() / sizeof(float))};
    std::memcpy(t.values.data(), bytes.data(), bytes.size());
    out.push_back(std::move(t));
  }
  return out;
}

CheckpointInfo read_checkpoint_info(const fs::path& checkpoint) {
  return info_of(io::SafetensorsFile::load(checkpoint / kStateFile));
}

VerifiedCheckpoint verify_checkpoint(const fs::path& checkpoint) {
  auto model_file = io::SafetensorsFile::load(checkpoint / kModelFile);  // verifies the checksums
  auto state_file = io::SafetensorsFile::load(checkpoint / kStateFile);
  load_hook_tensors(checkpoint);
  return {info_of(state_file), model_file.checksummed() && state_file.checksummed()};
}

CheckpointInfo load_checkpoint(const fs::path& checkpoint, nn::Module& model, optim::Optimizer& optimizer,
                               tower::LossScaler* loss_scaler) {
  // Read and validate both files completely (checksums included) before touching the model or
  // the optimizer.
  auto model_file = io::SafetensorsFile::load(checkpoint / kModelFile);
  auto state_file = io::SafetensorsFile::load(checkpoint / kStateFile);
  CheckpointInfo info = info_of(state_file);
  note_unchecked(checkpoint, model_file, state_file);

  optim::OptimizerState current = optimizer.state();
  optim::OptimizerState loaded;
  loaded.step = metadata_int(state_file, "optimizer_step");
  if (auto it = state_file.metadata().find("optimizer_slot_steps"); it != state_file.metadata().end()) {
    const auto parsed = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    bool ok = parsed.is_object();
    if (ok)
      for (const auto& [slot, steps] : parsed.items()) {
        if (!steps.is_number_integer() || steps.get<std::int64_t>() < 0 || steps.get<std::int64_t>() > loaded.step) {
          ok = false;
          break;
        }
        loaded.slot_steps[slot] = steps.get<std::int64_t>();
      }
    if (!ok)
      raise<DataError>("checkpoint file ", state_file.source(), ": metadata field \"optimizer_slot_steps\" is \"",
                       it->second, "\", expected a JSON object of slot names to update counts of at most the "
                       "optimizer step ", loaded.step);
  }
  std::set<std::string> expected;
  for (const auto& s : current.tensors) {
    expected.insert(s.name);
    const auto* e = state_file.find(s.name);
    if (!e)
      raise<DataError>("checkpoint file ", state_file.source(), " lacks the optimizer state tensor \"", s.name,
                       "\" that ", optimizer.name(), " keeps (a checkpoint of another optimizer? resume with the optimizer that wrote it)");
    if (e->dtype != io::DType::F32 || static_cast<std::size_t>(io::numel_of(e->shape)) != s.values.size())
      raise<DataError>("checkpoint file ", state_file.source(), ": optimizer state tensor \"", s.name, "\" is ",
                       io::to_string(e->dtype), " ", io::shape_string(e->shape), ", expected F32 with ",
                       s.values.size(), " elements");
    auto bytes = state_file.data(*e);
    optim::NamedState ns{s.name, std::vector<float>(s.values.size())};
    std::memcpy(ns.values.data(), bytes.data(), bytes.size());
    loaded.tensors.push_back(std::move(ns));
  }
  for (const auto& e : state_file.entries())
    if (!expected.count(e.name))
      raise<DataError>("checkpoint file ", state_file.source(), " holds optimizer state \"", e.name, "\" that ",
                       optimizer.name(), " does not keep (a checkpoint of another optimizer or model?)");
  if (auto it = info.metadata.find("optimizer"); it != info.metadata.end() && it->second != optimizer.name())
    raise<DataError>("checkpoint ", checkpoint.string(), " was written by optimizer ", it->second,
                     ", this run uses ", optimizer.name(), "; resume with the same optimizer");

  const auto loss_scale = recorded_loss_scale(info.metadata, checkpoint);

  // load_module validates the model file fully before writing; the optimizer's state was checked
  // above, so load_state cannot fail after the model changed.
  io::load_module(model, model_file);
  optimizer.load_state(loaded);
  if (loss_scaler && loss_scale) {
    loss_scaler->load_state(*loss_scale);
  } else if (loss_scaler) {
    log_info(str("resume: ", checkpoint.string(), " holds no loss scale (written by an fp32 or bf16 run); fp16 "
                 "starts from ", loss_scaler->scale()));
  }
  return info;
}

// Note [Resume from the newest intact checkpoint]: a checkpoint directory is written atomically,
// but its bytes can still change afterwards (a failing disk, a bad copy). Rank 0 reads each
// checkpoint, newest first, completely (checksums included) and resumes from the first intact
// one, saying which it passed over and why; when every one is damaged it raises rather than
// start a new run over them. The chosen one is read again by load_checkpoint on every rank: one
// more read of one checkpoint at start-up, for a choice that never lands on a damaged file.
std::optional<io::CheckpointInfo> newest_intact_checkpoint(const fs::path& train_dir,
                                                           std::vector<std::string>* passed_over) {
  std::error_code ec;
  if (!fs::is_directory(train_dir, ec)) return std::nullopt;
  const io::CheckpointDir dir(train_dir);
  const auto all = dir.list();
  std::vector<std::string> damaged;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(it->path);
    } catch (const DataError& e) {
      damaged.push_back(e.what());
      continue;
    } catch (const NotFound& e) {
      damaged.push_back(e.what());
      continue;
    }
    if (passed_over != nullptr) {
      *passed_over = damaged;
      return *it;
    }
    for (const auto& why : damaged)
      log_warning(str("resume: passing over a damaged checkpoint: ", why));
    if (!damaged.empty())
      log_warning(str("resume: resuming from ", it->path.string(), " (step ", it->step, "), the newest intact checkpoint; ",
                      damaged.size(), damaged.size() == 1 ? " newer one is" : " newer ones are",
                      " damaged and will be replaced as the run passes their steps"));
    return *it;
  }
  if (!damaged.empty()) {
    std::string list;
    for (const auto& why : damaged) list += "\n  " + why;
    raise<DataError>("resume: every checkpoint in ", dir.path().string(), " is damaged, nothing to resume from:", list,
                     "\nrestore a checkpoint from a copy, or start a new run there (start_over: move the damaged "
                     "ones aside or delete them)");
  }
  return std::nullopt;
}

io::CheckpointInfo find_checkpoint(const fs::path& train_dir, const std::string& which) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(train_dir, ec);
  const std::vector<io::CheckpointInfo> all = is_dir ? io::CheckpointDir(train_dir).list() : std::vector<io::CheckpointInfo>{};
  auto listed = [&] {
    if (all.empty()) return str(train_dir.string(), is_dir ? " holds no checkpoint" : " does not exist");
    std::string names;
    const std::size_t first = all.size() > 8 ? all.size() - 8 : 0;
    for (std::size_t i = first; i < all.size(); ++i)
      names += (names.empty() ? "" : ", ") + all[i].path.filename().string();
    return str(train_dir.string(), " holds ", first > 0 ? str("(the newest ", all.size() - first, " of ", all.size(), ") ") : "",
               names);
  };
  // A path to a directory: it must be one of train_dir's checkpoints.
  const fs::path asked(which);
  if (asked.has_parent_path() && fs::is_directory(asked, ec)) {
    for (const auto& c : all)
      if (fs::equivalent(c.path, asked, ec)) return c;
    raise<InvalidArgument>("checkpoint ", which, " is not one of ", train_dir.string(),
                           "'s; a run continues in its own train_dir: copy the checkpoint there, or start a new "
                           "run from its weights (init_from)");
  }
  // A name or a step: ckpt-0000000200, ckpt-200 or 200.
  std::string_view s = which;
  if (s.starts_with("ckpt-")) s.remove_prefix(5);
  std::int64_t step = -1;
  auto [end, errc] = std::from_chars(s.data(), s.data() + s.size(), step);
  if (errc != std::errc() || end != s.data() + s.size() || step < 0)
    raise<InvalidArgument>("checkpoint \"", which, "\" names no step; write its name (ckpt-200 or ",
                           io::CheckpointDir::name_for_step(200), "), its step (200) or its path");
  for (const auto& c : all)
    if (c.step == step) return c;
  raise<NotFound>("no checkpoint of step ", step, " (\"", which, "\"): ", listed());
}

fs::path resolve_model_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (fs::is_regular_file(path / kModelFile, ec)) return path / kModelFile;
  if (fs::is_directory(path, ec)) {
    io::CheckpointDir dir(path);
    if (auto latest = dir.latest()) return latest->path / kModelFile;
    raise<NotFound>("no checkpoint in ", path.string(), " (expected ckpt-<step>/", kModelFile,
                    "); a training run with this train_dir writes them");
  }
  raise<NotFound>("checkpoint ", path.string(), " does not exist; pass a train_dir, a ckpt-<step> directory or a .safetensors file");
}

}  // namespace towerflow::train
