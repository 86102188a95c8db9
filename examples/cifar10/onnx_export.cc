#include "examples/cifar10/onnx_export.h"

#include <cstring>
#include <functional>
#include <set>
#include <map>

#include <onnx/onnx_pb.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

namespace towerflow::cifar10 {
namespace fs = std::filesystem;
namespace {

// Builds the graph: each call adds one node and returns its output's name.
class Graph {
 public:
  Graph(onnx::GraphProto& g, const io::SafetensorsFile& weights) : g_(g), w_(weights) {
    for (const auto& e : w_.entries()) by_name_[e.name] = &e;
  }

  // A weight of the checkpoint as an initializer, checked against the shape the graph needs.
  std::string weight(const std::string& name, const io::Shape& shape) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) raise<DataError>("the checkpoint has no tensor \"", name, "\", which the model needs");
    const io::SafetensorsFile::Entry& e = *it->second;
    if (e.dtype != io::DType::F32 || e.shape != shape)
      raise<DataError>("tensor \"", name, "\" is ", io::to_string(e.dtype), " ", shape_text(e.shape), ", the model needs F32 ",
                       shape_text(shape));
    if (!added_.insert(name).second) return name;
    onnx::TensorProto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : shape) t->add_dims(d);
    const auto bytes = w_.data(e);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));  // little-endian, as ONNX's
    return name;
  }

  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::function<void(onnx::NodeProto&)>& attributes = {}) {
    onnx::NodeProto* n = g_.add_node();
    n->set_op_type(op);
    const std::string out = op + "_" + std::to_string(g_.node_size());
    n->set_name(out);
    for (const auto& i : inputs) n->add_input(i);
    n->add_output(out);
    if (attributes) attributes(*n);
    return out;
  }

  std::string conv(const std::string& x, const std::string& prefix, int in, int out, int kernel, int stride,
                   int padding, bool bias) {
    std::vector<std::string> inputs{x, weight(prefix + ".weight", {out, in, kernel, kernel})};
    if (bias) inputs.push_back(weight(prefix + ".bias", {out}));
    return node("Conv", inputs, [&](onnx::NodeProto& n) {
      ints(n, "kernel_shape", {kernel, kernel});
      ints(n, "strides", {stride, stride});
      ints(n, "pads", {padding, padding, padding, padding});
    });
  }
  std::string batch_norm(const std::string& x, const std::string& prefix, int channels) {
    return node("BatchNormalization",
                {x, weight(prefix + ".weight", {channels}), weight(prefix + ".bias", {channels}),
                 weight(prefix + ".running_mean", {channels}), weight(prefix + ".running_var", {channels})},
                [](onnx::NodeProto& n) { real(n, "epsilon", 1e-5f); });
  }
  std::string relu(const std::string& x) { return node("Relu", {x}); }
  std::string linear(const std::string& x, const std::string& prefix, int in, int out) {
    return node("Gemm", {x, weight(prefix + ".weight", {out, in}), weight(prefix + ".bias", {out})},
                [](onnx::NodeProto& n) { integer(n, "transB", 1); });
  }
  std::string max_pool(const std::string& x) {  // kernel 3, stride 2, padding 1
    return node("MaxPool", {x}, [](onnx::NodeProto& n) {
      ints(n, "kernel_shape", {3, 3});
      ints(n, "strides", {2, 2});
      ints(n, "pads", {1, 1, 1, 1});
    });
  }
  std::string flatten(const std::string& x) {
    return node("Flatten", {x}, [](onnx::NodeProto& n) { integer(n, "axis", 1); });
  }

 private:
  static std::string shape_text(const io::Shape& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }
  static void ints(onnx::NodeProto& n, const char* name, std::initializer_list<std::int64_t> v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  static void integer(onnx::NodeProto& n, const char* name, std::int64_t v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void real(onnx::NodeProto& n, const char* name, float v) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  onnx::GraphProto& g_;
  const io::SafetensorsFile& w_;
  std::map<std::string, const io::SafetensorsFile::Entry*> by_name_;
  std::set<std::string> added_;
};

// towerflow's TfCnn (models/tfcnn.cc): two 5x5 convolutions with ReLU and max pooling, three
// linear layers.
std::string tfcnn(Graph& g, const std::string& x, int h, int w, int classes) {
  const auto pooled = [](int n) { return ((n + 1) / 2 + 1) / 2; };
  std::string y = g.max_pool(g.relu(g.conv(x, "conv1", 3, 64, 5, 1, 2, true)));
  y = g.flatten(g.max_pool(g.relu(g.conv(y, "conv2", 64, 64, 5, 1, 2, true))));
  y = g.relu(g.linear(y, "fc1", 64 * pooled(h) * pooled(w), 384));
  y = g.relu(g.linear(y, "fc2", 384, 192));
  return g.linear(y, "fc3", 192, classes);
}

// towerflow's CifarResNet (models/resnet.cc): He et al.'s CIFAR ResNet-(6n+2), projection shortcuts.
std::string resnet(Graph& g, const std::string& x, int depth, int classes) {
  std::string y = g.relu(g.batch_norm(g.conv(x, "conv1", 3, 16, 3, 1, 1, false), "bn1", 16));
  int in = 16;
  const int widths[3] = {16, 32, 64};
  for (int s = 0; s < 3; ++s)
    for (int b = 0; b < (depth - 2) / 6; ++b) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      const int out = widths[s], stride = s > 0 && b == 0 ? 2 : 1;
      std::string z = g.relu(g.batch_norm(g.conv(y, p + ".conv1", in, out, 3, stride, 1, false), p + ".bn1", out));
      z = g.batch_norm(g.conv(z, p + ".conv2", out, out, 3, 1, 1, false), p + ".bn2", out);
      const std::string shortcut =
          stride != 1 || in != out
              ? g.batch_norm(g.conv(y, p + ".downsample.0", in, out, 1, stride, 0, false), p + ".downsample.1", out)
              : y;
      y = g.relu(g.node("Add", {z, shortcut}));
      in = out;
    }
  return g.linear(g.flatten(g.node("GlobalAveragePool", {y})), "fc", 64, classes);
}

}  // namespace

ExportResult export_onnx(const ExportOptions& o) {
  if (o.onnx.empty()) raise<InvalidArgument>("--onnx: give the file to write, e.g. --onnx model.onnx");
  ExportResult r;
  r.model_file = train::resolve_model_file(o.checkpoint);
  io::Metadata meta;
  if (fs::exists(r.model_file.parent_path() / train::kStateFile))
    meta = train::read_checkpoint_info(r.model_file.parent_path()).metadata;
  r.model = !o.model.empty() ? o.model : meta.count("model") ? meta["model"] : "tfcnn";
  if (meta.count("num_classes")) r.classes = std::stoi(meta["num_classes"]);
  if (auto it = meta.find("image_size"); it != meta.end() && it->second.find('x') != std::string::npos) {
    r.image_height = std::stoi(it->second.substr(0, it->second.find('x')));
    r.image_width = std::stoi(it->second.substr(it->second.find('x') + 1));
  }
  const io::SafetensorsFile weights = io::SafetensorsFile::load(r.model_file);

  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);  // 8 with Debian 12's ONNX 1.12; opset 13 needs 7
  model.set_producer_name("towerflow");
  model.set_model_version(1);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  for (const char* key : {"model", "image_size", "mean", "std", "class_names", "num_classes", "towerflow_version",
                          "towerflow_commit", "run_id", "step"})
    if (auto it = meta.find(key); it != meta.end()) {
      onnx::StringStringEntryProto* p = model.add_metadata_props();
      p->set_key(key);
      p->set_value(it->second);
    }
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name("towerflow_" + r.model);
  const auto tensor_type = [](onnx::ValueInfoProto* v, const std::string& name, std::vector<std::int64_t> dims) {
    v->set_name(name);
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    onnx::TensorShapeProto_Dimension* batch = t->mutable_shape()->add_dim();
    batch->set_dim_param("batch");
    for (auto d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  tensor_type(graph.add_input(), "input", {3, r.image_height, r.image_width});
  Graph g(graph, weights);
  std::string logits;
  if (r.model == "tfcnn") {
    logits = tfcnn(g, "input", r.image_height, r.image_width, r.classes);
  } else if (r.model.starts_with("resnet") && r.model.size() > 6 &&
             r.model.find_first_not_of("0123456789", 6) == std::string::npos &&
             (std::stoi(r.model.substr(6)) - 2) % 6 == 0 && std::stoi(r.model.substr(6)) >= 8) {
    logits = resnet(g, "input", std::stoi(r.model.substr(6)), r.classes);
  } else {
    raise<InvalidArgument>("model \"", r.model, "\" has no ONNX export; towerflow exports tfcnn and resnet20, 32, 44, "
                           "56, 110 (or any 6n+2)");
  }
  // The last node's output is the graph's "logits".
  graph.mutable_node(graph.node_size() - 1)->set_output(0, "logits");
  tensor_type(graph.add_output(), "logits", {r.classes});
  r.nodes = graph.node_size();
  std::string bytes;
  if (!model.SerializeToString(&bytes)) raise<DataError>("could not serialise the ONNX model of ", r.model_file.string());
  r.onnx = o.onnx;
  io::write_file_atomically(r.onnx, bytes);
  return r;
}

}  // namespace towerflow::cifar10
