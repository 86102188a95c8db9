// towerflow_devices: what the process options make of a machine's devices.
//
//   towerflow_devices                                   this machine, default options
//   towerflow_devices --device_count CPU=4 --json       four logical CPU devices, as JSON
//   towerflow_devices --config train.ini --allow_growth=false
//   towerflow_devices --platform dgx.json --visible_device_list 1,0 --virtual_devices "0:1024,2048;1:"
//
// With --platform the machine is a description (a dry run: "what would these options give
// there"); CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are applied to its GPUs as the driver would.
// Nothing here opens a device: the listing uses the same resolution as the registry without
// creating allocators or contexts. Bad options exit with status 1 and the message on stderr.
//
// Under mpirun (mpirun -np 4 towerflow_devices) rank 0 prints its own listing and then the job's
// tower layout: every rank's host, local rank and default replicas, and the global tower
// numbers the tower trainer gives them (rank * devices per process + i).

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/collectives/process_group.h"
#include "core/cpu/bf16.h"
#include "core/cpu/isa.h"

#include "core/error.h"
#include "core/platform/logical.h"
#include "core/platform/options.h"
#include "core/platform/platform.h"

namespace tw = towerflow;

namespace {

nlohmann::ordered_json to_json(const tw::Platform& platform, const tw::ProcessOptions& opts,
                       const std::vector<tw::LogicalDevice>& devices) {
  nlohmann::ordered_json physical = nlohmann::ordered_json::array();
  tw::HostDescription host = platform.host();
  physical.push_back({{"kind", "CPU"}, {"index", 0}, {"cores", host.cores}, {"memory_bytes", host.memory_bytes}});
  auto gpus = platform.gpus();
  for (std::size_t i = 0; i < gpus.size(); ++i)
    physical.push_back({{"kind", "GPU"},
                        {"index", i},
                        {"name", gpus[i].name},
                        {"memory_bytes", gpus[i].memory_bytes},
                        {"pci_bus_id", gpus[i].pci_bus_id},
                        {"compute_capability", gpus[i].compute_capability()}});
  nlohmann::ordered_json logical = nlohmann::ordered_json::array();
  for (const auto& d : devices)
    logical.push_back({{"name", d.device.full_name()},
                       {"kind", std::string(tw::to_string(d.device.kind))},
                       {"index", d.device.index},
                       {"physical_index", d.physical_index},
                       {"memory_limit_bytes", d.memory_limit_bytes},
                       {"allow_growth", d.allow_growth},
                       {"intra_op_threads", d.intra_op_threads},
                       {"description", d.description}});
  nlohmann::ordered_json built = nlohmann::ordered_json::array(), supported = nlohmann::ordered_json::array();
  for (auto i : tw::cpu::built_isas()) built.push_back(tw::cpu::isa_name(i));
  for (auto i : tw::cpu::supported_isas()) supported.push_back(tw::cpu::isa_name(i));
  nlohmann::ordered_json bf16_built = nlohmann::ordered_json::array();
  for (auto k : tw::cpu::built_bf16_kernels()) bf16_built.push_back(tw::cpu::bf16_kernels_name(k));
  return {{"platform", platform.name()},
          {"cpu_kernels",
           {{"isa", tw::cpu::isa_name(tw::cpu::active_isa())},
            {"why", tw::cpu::describe_active_isa()},
            {"built", built},
            {"supported", supported},
            {"cpu_features", tw::cpu::cpu_features()}}},
          {"bf16_kernels",
           {{"kernels", tw::cpu::bf16_kernels_name(tw::cpu::active_bf16_kernels())},
            {"built", bf16_built},
            {"onednn_isa", tw::cpu::onednn_isa()},
            {"why", tw::cpu::describe_bf16_kernels()}}},
          {"options",
           {{"summary", tw::to_string(opts)},
            {"allow_soft_placement", opts.allow_soft_placement.value_or(false)},
            {"log_device_placement", opts.log_device_placement.value_or(false)}}},
          {"physical", physical},
          {"logical", logical}};
}

// The default replicas: the GPUs if there are any, else the CPU devices.
std::vector<tw::Device> default_replicas(const std::vector<tw::LogicalDevice>& devices) {
  bool any_gpu = false;
  for (const auto& d : devices) any_gpu = any_gpu || d.device.is_gpu();
  std::vector<tw::Device> out;
  for (const auto& d : devices)
    if (d.device.is_gpu() == any_gpu) out.push_back(d.device);
  return out;
}

// Every rank's host and default replicas, gathered on rank 0 as one JSON object per rank.
nlohmann::ordered_json job_layout(tw::collectives::ProcessGroup& world, const std::vector<tw::LogicalDevice>& devices) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  nlohmann::ordered_json mine = {{"rank", world.rank()}, {"host", host}, {"local_rank", world.local_rank()}};
  nlohmann::ordered_json replicas = nlohmann::ordered_json::array();
  for (const auto& d : default_replicas(devices)) replicas.push_back(d.str());
  mine["replicas"] = replicas;
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  int tower = 0;
  for (const std::string& s : world.all_gather(mine.dump())) {
    auto r = nlohmann::ordered_json::parse(s);
    r["first_tower"] = tower;
    tower += static_cast<int>(r["replicas"].size());
    all.push_back(r);
  }
  return all;
}

void print_text(const tw::Platform& platform, const tw::ProcessOptions& opts,
                const std::vector<tw::LogicalDevice>& devices) {
  tw::HostDescription host = platform.host();
  std::cout << "Physical devices on " << platform.name() << ":\n";
  std::cout << "  CPU 0: " << host.cores << " hardware thread" << (host.cores == 1 ? "" : "s") << ", "
            << tw::format_byte_size(host.memory_bytes) << " memory\n";
  auto gpus = platform.gpus();
  for (std::size_t i = 0; i < gpus.size(); ++i)
    std::cout << "  GPU " << i << ": " << gpus[i].name << ", " << tw::format_byte_size(gpus[i].memory_bytes)
              << (gpus[i].pci_bus_id.empty() ? "" : ", pci bus id " + gpus[i].pci_bus_id)
              << ", compute capability " << gpus[i].compute_capability() << "\n";
  std::string built;
  for (auto i : tw::cpu::built_isas()) built += (built.empty() ? "" : ", ") + std::string(tw::cpu::isa_name(i));
  std::cout << "CPU kernels (this machine): " << tw::cpu::describe_active_isa() << "; built for " << built
            << "; the CPU has " << tw::cpu::cpu_features() << "\n";
  std::cout << "bf16 kernels (this machine): " << tw::cpu::describe_bf16_kernels() << "\n";
  std::cout << "Options: " << tw::to_string(opts) << "\n";
  std::cout << "Logical devices:\n";
  for (const auto& d : devices) std::cout << "  " << d.device.full_name() << " -> " << d.description << "\n";
  std::string replicas;
  for (const auto& d : default_replicas(devices)) replicas += (replicas.empty() ? "" : ", ") + d.str();
  std::cout << "Default replicas: " << replicas << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"towerflow_devices: lists the physical devices and the logical devices the process options "
               "make of them (TensorFlow's numbering). With --platform, a dry run on a described machine."};
  std::string config, platform_file;
  bool json = false;
  app.add_option("--config", config, "INI file with process options (flags win over it)")->check(CLI::ExistingFile);
  app.add_option("--platform", platform_file,
                 "JSON description of a machine to dry-run the options on: {\"cpu\": {\"cores\", \"memory_bytes\"}, "
                 "\"gpus\": [{\"name\", \"memory_bytes\", \"pci_bus_id\", \"compute_capability\"}]}");
  app.add_flag("--json", json, "print one JSON document instead of text");
  tw::ProcessOptions flags;
  tw::add_process_option_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help is 0; every bad flag is 1, as bad options are
  }
  try {
    tw::ProcessOptions opts = config.empty() ? flags : tw::ProcessOptions::from_ini(config).merged_with(flags);
    opts = tw::apply_environment(opts);
    std::unique_ptr<tw::Platform> platform;
    if (platform_file.empty()) {
      platform = tw::make_system_platform();
    } else {
      auto described = tw::load_platform_json(platform_file);
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      const char* order = std::getenv("CUDA_DEVICE_ORDER");
      std::string name = described->name();
      if (visible) name += std::string(", CUDA_VISIBLE_DEVICES=") + visible;
      if (order) name += std::string(", CUDA_DEVICE_ORDER=") + order;
      platform = tw::make_described_platform(described->host(),
                                             tw::apply_cuda_environment(described->gpus(), visible, order), name);
    }
    auto devices = tw::resolve_logical_devices(opts, *platform);
    tw::collectives::ProcessGroup& world = tw::collectives::world();
    nlohmann::ordered_json job;
    if (world.size() > 1) job = job_layout(world, devices);
    if (world.rank() != 0) return 0;
    if (json) {
      auto out = to_json(*platform, opts, devices);
      if (world.size() > 1) out["processes"] = {{"group", world.name()}, {"ranks", job}};
      std::cout << out.dump(2) << "\n";
    } else {
      print_text(*platform, opts, devices);
      if (world.size() > 1) {
        std::cout << "Processes: " << world.name() << "; towers of the job (tower: rank, host, device):\n";
        std::size_t per_rank = job[0]["replicas"].size();
        for (const auto& r : job) {
          int t = r["first_tower"];
          for (const auto& d : r["replicas"])
            std::cout << "  tower " << t++ << ": rank " << r["rank"].get<int>() << " (local rank "
                      << r["local_rank"].get<int>() << ") on " << r["host"].get<std::string>() << ", "
                      << d.get<std::string>() << "\n";
          if (r["replicas"].size() != per_rank)
            std::cout << "  (rank " << r["rank"].get<int>() << " has " << r["replicas"].size()
                      << " replicas, rank 0 has " << per_rank
                      << ": the tower trainer needs the same number in every process)\n";
        }
      }
    }
  } catch (const tw::Error& e) {
    std::cerr << "towerflow_devices: " << tw::render_options(e.what(), tw::process_option_flag) << "\n";
    return 1;
  }
  return 0;
}
