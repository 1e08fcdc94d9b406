// RunCommand: runs a program with a time limit and captures what it printed,
// for tests that judge the thindisk binary from the outside.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace thindisk::testing {

struct CommandResult {
  bool started = false;    // false: the program could not be executed
  bool timed_out = false;  // killed after the time limit
  bool signaled = false;   // died from a signal (a crash)
  int signal = 0;
  int exit_code = -1;      // valid when !signaled && !timed_out
  std::string out;         // stdout
  std::string err;         // stderr
};

// Runs argv[0] (searched in PATH) with stdin from /dev/null. Kills it with
// SIGKILL after `limit`. Not thread-safe with respect to SIGCHLD handlers.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds limit = std::chrono::seconds(30));

// "argv[0] argv[1] ..." for messages.
std::string JoinArgs(const std::vector<std::string>& argv);

// True if `program` names an executable file, directly or through PATH.
bool IsExecutable(const std::string& program);

}  // namespace thindisk::testing
