#include "examples/cifar10/predict.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor/tensor.h"
#include "data/augment.h"
#include "data/image_codec.h"
#include "examples/cifar10/training.h"
#include "io/atomic_file.h"
#include "io/model_state.h"
#include "models/models.h"
#include "train/checkpoint.h"

namespace towerflow::cifar10 {
namespace fs = std::filesystem;
namespace {

// Every input file, folders expanded (recursively, in name order).
std::vector<fs::path> input_files(const std::vector<std::string>& inputs) {
  if (inputs.empty()) raise<InvalidArgument>("no image to classify; give image files or folders after the flags");
  std::vector<fs::path> out;
  for (const auto& in : inputs) {
    const fs::path p(in);
    if (fs::is_directory(p)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && data::is_image_file(e.path())) found.push_back(e.path());
      if (found.empty()) raise<NotFound>("folder ", in, " holds no .jpg, .jpeg or .png file");
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p)) {
      out.push_back(p);
    } else {
      raise<NotFound>("image ", in, " does not exist");
    }
  }
  return out;
}

std::string percent(float p) { return str(std::round(p * 1000.0f) / 10.0f, "%"); }

}  // namespace

Predictions run_prediction(const TrainOptions& given, const PredictOptions& predict, ProcessOptions process,
                           train::Reporter& reporter) {
  if (predict.top_k < 1) raise<InvalidArgument>("--top_k ", predict.top_k, " must be at least 1");
  if (predict.batch < 1) raise<InvalidArgument>("--batch_size ", predict.batch, " must be at least 1");
  const fs::path model_file = train::resolve_model_file(predict.checkpoint);
  io::Metadata meta;
  if (fs::exists(model_file.parent_path() / train::kStateFile))
    meta = train::read_checkpoint_info(model_file.parent_path()).metadata;
  // The run's preprocessing, as its options recorded it.
  TrainOptions o = given;
  if (auto it = meta.find("options"); it != meta.end()) {
    const nlohmann::json then = nlohmann::json::parse(it->second, nullptr, false);
    for (const char* key : {"image_size", "mean", "std", "model"})
      if (then.is_object() && then.contains(key)) set_train_option(o, key, then[key].get<std::string>());
  }
  const std::string model = !predict.model.empty() ? predict.model : o.model;
  const Preprocessing prep = preprocessing(o);
  Predictions result;
  const int classes = meta.count("num_classes") ? std::stoi(meta["num_classes"]) : 10;
  if (auto it = meta.find("class_names"); it != meta.end()) {
    const nlohmann::json names = nlohmann::json::parse(it->second, nullptr, false);
    if (names.is_array())
      for (const auto& n : names) result.class_names.push_back(n.is_string() ? n.get<std::string>() : n.dump());
  }
  if (static_cast<int>(result.class_names.size()) != classes) {
    result.class_names.clear();
    for (int c = 0; c < classes; ++c) result.class_names.push_back(std::to_string(c));
  }

  const std::vector<fs::path> files = input_files(predict.inputs);
  // Every image read first: a bad file is reported before anything is printed.
  const data::ImageShape shape{prep.height, prep.width, 3};
  const data::Augmenter normalise(data::Augment{.mean = prep.mean, .std = prep.std}, shape);
  std::vector<float> pixels(files.size() * shape.bytes());
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string bytes = io::read_file(files[i]);
    const data::Image img = data::decode_image(
        std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()),
        files[i].string());
    const data::Image sized = data::resize_bilinear(img, shape.h, shape.w);
    normalise.apply(sized.pixels.data(), pixels.data() + i * shape.bytes(), data::AugmentChoice{});
  }

  std::vector<Device> devices = choose_devices(o, process);
  auto net = models::make_model(model, devices.front(),
                                {.num_classes = classes, .image_height = prep.height, .image_width = prep.width});
  io::load_module(*net, model_file, {.destination = "the model " + model});
  net->train(false);
  reporter.block("start", "towerflow cifar10_predict",
                 {{"checkpoint", model_file.string()},
                  {"model", str(model, " (", classes, " classes)")},
                  {"images", str(files.size(), " at ", prep.height, "x", prep.width, ", normalised with mean (",
                                 prep.mean[0], ", ", prep.mean[1], ", ", prep.mean[2], "), std (", prep.std[0], ", ",
                                 prep.std[1], ", ", prep.std[2], ")")},
                  {"device", devices.front().str()}});

  const int k = std::min(predict.top_k, classes);
  const bool json = reporter.progress() == train::Progress::Json;
  const NoGradGuard no_grad;
  for (std::size_t begin = 0; begin < files.size(); begin += static_cast<std::size_t>(predict.batch)) {
    const int n = static_cast<int>(std::min<std::size_t>(predict.batch, files.size() - begin));
    const Tensor x = Tensor::from_host(std::span<const float>(pixels.data() + begin * shape.bytes(), n * shape.bytes()),
                                       {n, shape.h, shape.w, 3}, devices.front());
    const std::vector<float> logits = net->forward(x).to_host();
    for (int r = 0; r < n; ++r) {
      Prediction p;
      p.path = files[begin + static_cast<std::size_t>(r)].string();
      p.logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(r) * classes,
                      logits.begin() + static_cast<std::ptrdiff_t>(r + 1) * classes);
      const float top = *std::max_element(p.logits.begin(), p.logits.end());
      double sum = 0;
      for (float l : p.logits) sum += std::exp(static_cast<double>(l - top));
      for (float l : p.logits) p.probabilities.push_back(static_cast<float>(std::exp(static_cast<double>(l - top)) / sum));
      std::vector<int> order(static_cast<std::size_t>(classes));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.logits[a] > p.logits[b]; });
      p.top.assign(order.begin(), order.begin() + k);
      if (json) {
        nlohmann::ordered_json j;
        j["path"] = p.path;
        nlohmann::ordered_json tops = nlohmann::ordered_json::array();
        for (int c : p.top) tops.push_back({{"class", result.class_names[c]}, {"index", c}, {"prob", p.probabilities[c]}});
        j["top"] = tops;
        j["logits"] = p.logits;
        reporter.line(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
      } else {
        std::string text = p.path + "  ";
        for (std::size_t t = 0; t < p.top.size(); ++t)
          text += str(t ? ", " : "", result.class_names[p.top[t]], " ", percent(p.probabilities[p.top[t]]));
        reporter.line(text);
      }
      result.images.push_back(std::move(p));
    }
  }
  return result;
}

}  // namespace towerflow::cifar10
