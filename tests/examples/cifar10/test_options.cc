#include <catch2/catch.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "examples/cifar10/train_options.h"

namespace tw = towerflow;
using namespace towerflow::cifar10;

namespace {

// Parses a command line the way cifar10_train does; returns what it resolves to.
Resolved parse(std::vector<std::string> args) {
  CLI::App app{"test"};
  TrainCommandLine cli;
  cli.add_to(app);
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  app.parse(args);
  return cli.resolve();
}

std::string temp_file(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "-" + name);
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("every option parses from its text form, with typed errors for bad values", "[cifar10][options]") {
  TrainOptions o;
  set_train_option(o, "lr", "0.25");
  set_train_option(o, "batch_size", "256");
  set_train_option(o, "max_steps", "5000000000");
  set_train_option(o, "resume", "true");
  set_train_option(o, "json", "0");
  set_train_option(o, "progress", "plain");
  set_train_option(o, "model", " resnet20 ");
  set_train_option(o, "seed", "18446744073709551615");
  CHECK(o.lr == 0.25);
  CHECK(o.batch_size == 256);
  CHECK(o.max_steps == 5'000'000'000);
  CHECK(o.resume);
  CHECK_FALSE(o.json);
  CHECK(o.progress == "plain");
  CHECK(o.model == "resnet20");
  CHECK(o.seed == 18446744073709551615ull);

  CHECK_THROWS_WITH(set_train_option(o, "lr", "fast"), Catch::Contains("--lr") && Catch::Contains("\"fast\"") &&
                                                           Catch::Contains("not a number"));
  CHECK_THROWS_WITH(set_train_option(o, "batch_size", "0"), Catch::Contains("--batch_size") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(set_train_option(o, "batch_size", "12.5"), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(set_train_option(o, "lr", "nan"), Catch::Contains("not a number"));
  CHECK_THROWS_WITH(set_train_option(o, "progress", "nonsense"),
                    Catch::Contains("--progress \"nonsense\" is not one of auto, plain, live, json"));
  CHECK_THROWS_WITH(set_train_option(o, "resume", "maybe"), Catch::Contains("--resume") && Catch::Contains("true or false"));
  set_train_option(o, "cutout", "16");
  set_train_option(o, "label_smoothing", "0.1");
  CHECK(o.cutout == 16);
  CHECK(o.label_smoothing == 0.1);
  CHECK_THROWS_WITH(set_train_option(o, "cutout", "-4"), Catch::Contains("--cutout") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(set_train_option(o, "label_smoothing", "1"),
                    Catch::Contains("--label_smoothing") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(set_train_option(o, "learning_rate", "1"),
                    Catch::Contains("learning_rate") && Catch::Contains("batch_size"));
  CHECK_THROWS_AS(set_train_option(o, "momentum", "1.5"), tw::InvalidArgument);
  CHECK(o.lr == 0.25);  // failed sets change nothing
}

TEST_CASE("the batch_norm option is per_tower or sync, anything else names the flag, the value and the choices",
          "[cifar10][options]") {
  CHECK(TrainOptions{}.batch_norm == "per_tower");
  CHECK(parse({"--batch_norm", "sync"}).train.batch_norm == "sync");
  CHECK(parse({"--batch_norm", "per_tower"}).train.batch_norm == "per_tower");
  CHECK(parse_config("[train]\nbatch_norm = sync\n", "t.ini").train.batch_norm == "sync");
  TrainOptions o;
  CHECK_THROWS_WITH(set_train_option(o, "batch_norm", "synced"),
                    Catch::Contains("--batch_norm") && Catch::Contains("\"synced\"") &&
                        Catch::Contains("per_tower, sync"));
  CHECK_THROWS_WITH(set_train_option(o, "batch_norm", ""), Catch::Contains("per_tower, sync"));
  CHECK_THROWS_AS(parse({"--batch_norm", "global"}), CLI::ValidationError);
  try {
    parse({"--batch_norm", "global"});
  } catch (const CLI::ValidationError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("\"global\"") && Catch::Contains("per_tower, sync"));
  }
  CHECK_THROWS_WITH(parse_config("batch_norm = both\n", "t.ini"),
                    Catch::Contains("t.ini:1") && Catch::Contains("--batch_norm") && Catch::Contains("per_tower, sync"));
  CHECK(o.batch_norm == "per_tower");  // failed sets change nothing
}

TEST_CASE("a config file sets training and device options, flags win over it", "[cifar10][options]") {
  std::string path = temp_file("train.ini",
                               "# a run\n"
                               "batch_size = 64\n"
                               "allow_soft_placement = true\n"
                               "[train]\n"
                               "model = resnet20   # the small ResNet\n"
                               "lr = \"0.2\"\n"
                               "[cpu]\n"
                               "device_count = CPU=3\n"
                               "[towerflow]\n"
                               "ignore_sections = other_program\n"
                               "[other_program]\n"
                               "whatever = 1\n");
  auto r = parse({"--config", path, "--lr", "0.01", "--device_count", "CPU=2", "--json"});
  CHECK(r.train.batch_size == 64);
  CHECK(r.train.model == "resnet20");
  CHECK(r.train.lr == 0.01);  // the flag wins
  CHECK(r.train.json);
  CHECK(r.process.allow_soft_placement == true);
  CHECK(r.process.device_count.at("CPU") == 2);  // the flag wins here too

  auto file_only = parse({"--config", path});
  CHECK(file_only.train.lr == 0.2);
  CHECK(file_only.process.device_count.at("CPU") == 3);
  CHECK(file_only.train.epochs == TrainOptions{}.epochs);  // unset keys keep defaults
  std::filesystem::remove(path);
}

TEST_CASE("config file mistakes name the file, the line and the fix", "[cifar10][options]") {
  CHECK_THROWS_WITH(parse_config("[train]\nlr = 0.1\nlr = 0.2\n", "t.ini"),
                    Catch::Contains("t.ini:3") && Catch::Contains("already set on line 2"));
  CHECK_THROWS_WITH(parse_config("\n[train]\nbatch_sise = 3\n", "t.ini"),
                    Catch::Contains("t.ini:3") && Catch::Contains("batch_sise"));
  CHECK_THROWS_WITH(parse_config("[train]\nepochs\n", "t.ini"), Catch::Contains("t.ini:2") && Catch::Contains("key = value"));
  CHECK_THROWS_WITH(parse_config("epochs = many\n", "t.ini"), Catch::Contains("t.ini:1") && Catch::Contains("--epochs"));
  // Keys at the top that are not training options go to the device options, which reject
  // unknown ones with their own line number intact.
  CHECK_THROWS_WITH(parse_config("epochs = 3\n\nno_such_option = 1\n", "t.ini"), Catch::Contains("t.ini:3"));
  CHECK_THROWS_AS(load_config("/nonexistent/train.ini"), tw::NotFound);
}

TEST_CASE("bad flags are refused by the parser with the option's message", "[cifar10][options]") {
  CHECK_THROWS_AS(parse({"--batch_size", "-4"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--no_such_flag", "1"}), CLI::ExtrasError);
  auto r = parse({"--resume", "--seed", "7"});
  CHECK(r.train.resume);
  CHECK(r.train.seed == 7);
  CHECK_FALSE(parse({"--resume=false"}).train.resume);
}

TEST_CASE("a flag given twice takes its last value", "[cifar10][options]") {
  auto r = parse({"--cutout", "12", "--lr", "0.1", "--cutout", "0", "--lr", "0.05"});
  CHECK(r.train.cutout == 0);
  CHECK(r.train.lr == 0.05);
  // The value that wins is still checked.
  CHECK_THROWS_AS(parse({"--batch_size", "128", "--batch_size", "-4"}), CLI::ValidationError);
}

TEST_CASE("cifar10_train --help lists every option with its default", "[cifar10][options]") {
  CLI::App app{"cifar10_train"};
  TrainCommandLine cli;
  cli.add_to(app);
  std::string help = app.help();
  for (const auto& doc : describe_train_options(TrainOptions{})) {
    INFO(doc.name);
    CHECK(help.find("--" + doc.name) != std::string::npos);
  }
  CHECK(help.find("--config") != std::string::npos);
  CHECK(help.find("--allow_growth") != std::string::npos);  // the device options are there too
  CHECK(help.find("--log_device_placement") != std::string::npos);
  CHECK(help.find("128") != std::string::npos);  // batch_size's default
  CHECK(help.find("per_tower|sync") != std::string::npos);  // batch_norm's choices and default
  CHECK(help.find("per_tower|sync=per_tower") != std::string::npos);
}

TEST_CASE("cifar10_train --help groups the options by topic, each with its default", "[cifar10][options]") {
  CLI::App app{"cifar10_train"};
  TrainCommandLine cli;
  cli.add_to(app);
  const std::string help = app.help();
  // The groups, in this order.
  const std::vector<std::string> groups = {"Data:", "Model:", "Devices:", "Towers:", "Optimizer:",
                                           "Training:", "Checkpoints:", "Output:"};
  std::vector<std::size_t> at;
  for (const auto& g : groups) {
    INFO(g);
    std::size_t pos = help.find("\n" + g + "\n");
    REQUIRE(pos != std::string::npos);
    at.push_back(pos);
  }
  CHECK(std::is_sorted(at.begin(), at.end()));
  // The group an option is listed under, and the text of its line.
  auto line_of = [&](const std::string& flag) {
    std::size_t pos = help.find("  " + flag + " ");
    REQUIRE(pos != std::string::npos);
    return help.substr(pos, help.find('\n', pos) - pos);
  };
  auto group_of = [&](const std::string& flag) {
    std::size_t pos = help.find("  " + flag + " ");
    std::string group;
    for (std::size_t i = 0; i < groups.size(); ++i)
      if (at[i] < pos) group = groups[i];
    return group;
  };
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"--data_dir", "Data:"},         {"--cutout", "Data:"},           {"--model", "Model:"},
      {"--devices", "Devices:"},       {"--num_gpus", "Devices:"},      {"--allow_growth", "Devices:"},
      {"--visible_device_list", "Devices:"}, {"--batch_size", "Towers:"}, {"--split", "Towers:"},
      {"--reduction", "Towers:"},      {"--batch_norm", "Towers:"},     {"--accumulation_steps", "Towers:"},
      {"--optimizer", "Optimizer:"},   {"--lr", "Optimizer:"},          {"--schedule", "Optimizer:"},
      {"--epochs", "Training:"},       {"--max_steps", "Training:"},    {"--seed", "Training:"},
      {"--train_dir", "Checkpoints:"}, {"--resume", "Checkpoints:"},    {"--save_every", "Checkpoints:"},
      {"--json", "Output:"},           {"--log_every", "Output:"},      {"--trace", "Output:"}};
  for (const auto& [flag, group] : expected) {
    INFO(flag);
    CHECK(group_of(flag) == group);
  }
  // Every training option shows its default ("" for an empty text), the switches too.
  for (const auto& doc : describe_train_options(TrainOptions{})) {
    INFO(doc.name);
    const std::string line = line_of("--" + doc.name);
    const std::string shown = doc.name == "devices" ? "all" : doc.value.empty() ? "\"\"" : doc.value;
    CHECK(line.find("=" + shown) != std::string::npos);
  }
  CHECK(line_of("--resume").find("FLAG=false") != std::string::npos);
  CHECK(line_of("--tensorboard").find("FLAG=true") != std::string::npos);
  CHECK(line_of("--lr").find("=0.05") != std::string::npos);
  // The device options show theirs.
  CHECK(line_of("--allow_growth").find("FLAG=false") != std::string::npos);
  CHECK(line_of("--visible_device_list").find("=all") != std::string::npos);
  CHECK(line_of("--intra_op_threads").find("=0") != std::string::npos);
  CHECK(help.find("{true}") == std::string::npos);  // switches read "--resume", as they are typed
}

TEST_CASE("options round-trip through their JSON form", "[cifar10][options]") {
  TrainOptions o;
  o.model = "resnet56";
  o.lr = 0.125;
  auto j = nlohmann::json::parse(to_json(o));
  CHECK(j["model"] == "resnet56");
  CHECK(j["lr"] == 0.125);
  CHECK(j["resume"] == false);
  CHECK(j.size() == describe_train_options(o).size());
}

TEST_CASE("a config file is read as Python's configparser reads it", "[cifar10][options]") {
  // 'key: value', names in any case, ';' and '#' comment lines, training and device keys mixed.
  auto c = parse_config("; the tutorial's file\n"
                        "[Train]\n"
                        "Batch_Size: 64\n"
                        "  # an indented comment\n"
                        "LR = 0.05\n"
                        "[gpu]\n"
                        "allow_growth: on\n"
                        "[DEFAULT]\n"
                        "epochs: 3\n",
                        "t.ini");
  CHECK(c.train.batch_size == 64);
  CHECK(c.train.lr == 0.05);
  CHECK(c.train.epochs == 3);
  CHECK(c.process.allow_growth == true);
  CHECK(c.train_keys == std::vector<std::string>{"batch_size", "lr", "epochs"});
  // What configparser refuses stays an error naming the file and line, in any section.
  CHECK_THROWS_WITH(parse_config("[train]\nlr = 0.1\n[other]\nno delimiter\n", "t.ini"), Catch::Contains("t.ini:4:"));
  CHECK_THROWS_WITH(parse_config("[train]\nlr = 0.1\n[train]\nepochs = 2\n", "t.ini"),
                    Catch::Contains("t.ini:3:") && Catch::Contains("section [train] is already given"));
  // An indented line continues the value above it, as in configparser; the error says so.
  CHECK_THROWS_WITH(parse_config("[train]\nlr = 0.1\n  epochs = 2\n", "t.ini"),
                    Catch::Contains("t.ini:2:") && Catch::Contains("continues to line 3"));
}

TEST_CASE("a misspelled section is refused, naming the nearest known one, declared foreign sections are skipped",
          "[cifar10][options]") {
  // Before, [trian] was skipped with every key in it: the run trained with the defaults.
  CHECK_THROWS_WITH(parse_config("[gpu]\nallow_growth = true\n[trian]\nlr = 0.5\nepochs = 90\n", "t.ini"),
                    Catch::Contains("t.ini:3: unknown section [trian]; did you mean [train]?") &&
                        Catch::Contains("[train], [gpu], [cpu], [devices], [session], [process], [DEFAULT] and [towerflow]") &&
                        Catch::Contains("skipped with every key in it") && Catch::Contains("Rename it to [train]") &&
                        Catch::Contains("[towerflow] section: ignore_sections = trian"));
  CHECK_THROWS_WITH(parse_config("[GPUs]\nallow_growth = true\n", "t.ini"), Catch::Contains("did you mean [gpu]?"));
  CHECK_THROWS_WITH(parse_config("[Default]\nepochs = 3\n", "t.ini"), Catch::Contains("did you mean [DEFAULT]?"));
  // A name near none of ours gets no guess, the same fix.
  CHECK_THROWS_WITH(parse_config("[train]\nlr = 0.1\n[pipeline]\nstage = 2\n", "t.ini"),
                    Catch::Contains("t.ini:3: unknown section [pipeline]. The sections of a --config file of "
                                    "cifar10_train and cifar10_eval are") &&
                        Catch::Contains("Rename it, or") && !Catch::Contains("did you mean"));
  // An empty misspelled section is refused too: its keys may be on their way.
  CHECK_THROWS_WITH(parse_config("[trian]\n", "t.ini"), Catch::Contains("t.ini:1: unknown section [trian]"));

  // A file shared with other programs declares their sections; their keys are not read.
  auto c = parse_config("[towerflow]\n"
                        "ignore_sections = pipeline, [eval_server]\n"
                        "    Notebook\n"  // a continuation line: one more name
                        "[train]\n"
                        "lr = 0.1\n"
                        "[pipeline]\n"
                        "lr = 7\n"
                        "[eval_server]\n"
                        "port = 8080\n"
                        "[notebook]\n"
                        "kernel = python3\n",
                        "t.ini");
  CHECK(c.train.lr == 0.1);
  CHECK(c.train_keys == std::vector<std::string>{"lr"});
  // Declaring one of our own sections, or another key in [towerflow], is a mistake.
  CHECK_THROWS_WITH(parse_config("[towerflow]\nignore_sections = other, train\n[train]\nlr = 0.1\n", "t.ini"),
                    Catch::Contains("t.ini:2: ignore_sections names [train], a section of a --config file of "
                                    "cifar10_train and cifar10_eval; remove it from the list"));
  CHECK_THROWS_WITH(parse_config("[towerflow]\nignore_section = other\n", "t.ini"),
                    Catch::Contains("t.ini:2: [towerflow] has no key ignore_section; it takes ignore_sections ="));
  // The device sections and [DEFAULT] are ours in any case, as before.
  CHECK(parse_config("[GPU]\nallow_growth = true\n[DEFAULT]\nepochs = 3\n", "t.ini").process.allow_growth == true);
}

TEST_CASE("text options must be UTF-8: they are recorded as JSON (found by fuzz/flag_values)", "[cifar10][options]") {
  TrainOptions o;
  // Before: accepted, then nlohmann::json threw type_error 316 when the first checkpoint's
  // metadata was written.
  CHECK_THROWS_WITH(set_train_option(o, "data_dir", "/data/caf\xe9"),
                    Catch::Contains("--data_dir") && Catch::Contains("not valid UTF-8"));
  CHECK_THROWS_AS(set_train_option(o, "train_dir", "run\xc0\xaf"), tw::InvalidArgument);      // overlong '/'
  CHECK_THROWS_AS(set_train_option(o, "train_dir", "run\xed\xa0\x80"), tw::InvalidArgument);  // a surrogate
  CHECK_THROWS_AS(set_train_option(o, "train_dir", "run\xf0\x9f\x98"), tw::InvalidArgument);  // cut short
  set_train_option(o, "train_dir", "runs/caf\xc3\xa9-\xf0\x9f\x98\x80");
  CHECK(o.train_dir == "runs/caf\xc3\xa9-\xf0\x9f\x98\x80");
  CHECK_NOTHROW(to_json(o));
  CHECK_THROWS_WITH(parse_config("[train]\nmodel = tfcnn\ntrain_dir = \xff\n", "t.ini"),
                    Catch::Contains("t.ini:3:") && Catch::Contains("not valid UTF-8"));
}

TEST_CASE("library errors name fields and the program shows its flags", "[cifar10][options]") {
  CHECK(as_flags("use a smaller FitOptions::batch, or raise the limit with "
                 "ProcessOptions::memory_limit_mb[/gpu:1] or ProcessOptions::per_process_gpu_memory_fraction") ==
        "use a smaller --batch_size, or raise the limit with --memory_limit gpu:1=<MiB> or "
        "--per_process_gpu_memory_fraction");
  CHECK(as_flags("use per-tower batch norm (TrainerOptions::batch_norm = BatchNormMode::PerTower) here") ==
        "use per-tower batch norm (--batch_norm per_tower) here");
  CHECK(as_flags("train in fp32 (TrainerOptions::precision = Precision::Fp32).") ==
        "train in fp32 (--precision fp32).");
  CHECK(as_flags("set ProcessOptions::allow_soft_placement = true to run it") ==
        "set --allow_soft_placement to run it");
  CHECK(as_flags("use LoaderOptions::batch = 32 or 34") == "use --batch_size 32 or 34");
  CHECK(as_flags("skip bad files: ImageFolderOptions::bad_files = BadFilePolicy::Skip)") ==
        "skip bad files: --skip_bad_files)");
  CHECK(as_flags("the built-in set (DatasetKind::Builtin)") == "the built-in set (--dataset builtin)");
  // A field without a flag of this program stays the library's name.
  CHECK(as_flags("fewer prefetched batches (LoaderOptions::prefetch)") ==
        "fewer prefetched batches (LoaderOptions::prefetch)");
}

TEST_CASE("cifar10_train --recipe airbench94 sets what the recipe fixes, except what a flag or the config file gives",
          "[cifar10][options][recipe]") {
  const std::string ini = temp_file("recipe.ini", "[train]\nlr = 2.0\n");
  Resolved r = parse({"--recipe", "airbench94", "--batch_size", "512", "--config", ini});
  CHECK(r.train.model == "airbench94");
  CHECK(r.train.batch_size == 512);  // the flag
  CHECK(r.train.lr == 2.0);          // the config file
  CHECK(r.train.epochs == 9.9);
  CHECK(r.train.optimizer == "nesterov");
  CHECK(r.train.momentum == 0.85);
  // airbench94's decoupled weight decay 0.0153 per 1024 examples at lr 11.5: 0.0153 / 11.5 per
  // example under a mean loss.
  CHECK(r.train.weight_decay == Approx(0.0153 / 11.5).epsilon(1e-9));
  CHECK(r.train.schedule == "linear:0=0.2,0.23=1,1=0.07");
  CHECK(r.train.label_smoothing == 0.2);
  CHECK(r.train.crop_padding == 2);
  CHECK(r.train.pad_mode == "reflect");
  CHECK(r.train.flip == "alternating");
  CHECK(r.train.tta == 2);
  CHECK(r.train.lookahead == 5);
  CHECK(r.train.batch_norm == "sync");  // statistics over the global batch, as on one device
  CHECK_FALSE(r.given.count("lookahead"));  // a resumed run takes the recorded value
  // Without a recipe nothing changes; an unknown one is refused naming the known ones.
  CHECK(parse({}).train.model == TrainOptions{}.model);
  TrainOptions o;
  CHECK_THROWS_WITH(set_train_option(o, "recipe", "airbench96"),
                    Catch::Contains("airbench96") && Catch::Contains("none, airbench94"));
  std::filesystem::remove(ini);
}
