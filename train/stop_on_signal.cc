#include "train/stop_on_signal.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace towerflow::train {
namespace {

volatile std::sig_atomic_t g_received = 0;
std::atomic<bool> g_installed{false};

void handle(int sig) {
  if (g_received != 0) {
    // The second signal: stop now, by that signal (the default action).
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_received = sig;
  const char* msg = sig == SIGINT ? "\nSIGINT: stopping after this step and writing a checkpoint (again: stop at once)\n"
                                  : "\nSIGTERM: stopping after this step and writing a checkpoint (again: stop at once)\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, std::strlen(msg));
  (void)ignored;
}

}  // namespace

StopOnSignal::StopOnSignal() {
  if (g_installed.exchange(true)) raise<InvalidArgument>("a StopOnSignal is already installed in this process");
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = handle;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a system call under way goes on: the step finishes
  sigaction(SIGINT, &sa, &previous_int_);
  sigaction(SIGTERM, &sa, &previous_term_);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
  g_installed = false;
}

int StopOnSignal::received() const { return g_received; }

void StopOnSignal::check() {
  if (int sig = g_received; sig != 0)
    stop_training(sig == SIGINT ? "SIGINT (Ctrl-C)" : sig == SIGTERM ? "SIGTERM" : "a signal", /*evaluate=*/false);
}

}  // namespace towerflow::train
