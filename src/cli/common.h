// Helpers shared by the thindisk subcommands: sizes, -o option strings,
// human sizes, errors, exit codes and the progress bar.
//
// Exit codes are decided in exactly one place (ExitCodeFor), so every
// subcommand agrees with qemu-img's conventions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/rate_limit.h"
#include "util/result.h"
#include "util/status.h"

namespace CLI {
class App;
}

namespace thindisk::cli {

// What a subcommand found, beyond plain success; errors travel as Status.
enum class Outcome {
  kSuccess,
  kImagesDiffer,         // compare: content or size differs
  kCheckFoundCorruption, // check: corruptions remain
  kCheckFoundLeaks,      // check: only leaks remain
  kCommandFailed,        // io: a command failed or a pattern did not match; rm: one failed
};

// Which exit code an error maps to: compare uses 2 (1 means "different").
enum class ErrorExit { kOne, kTwo };

// The single mapping from results to process exit codes (qemu-img's):
// success 0; compare: differ 1, error 2; check: corrupt 2, leaks only 3,
// could not run 1; any other error 1.
int ExitCodeFor(const Result<Outcome>& result, ErrorExit error_exit);

// Prints "thindisk: <message>" as one line on stderr.
void PrintError(const Status& status);
void PrintError(std::string_view message);
// Prints "thindisk: warning: <message>" on stderr.
void PrintWarning(std::string_view message);

// What a node that is not a regular file is, for the errors that refuse
// to make or remove an image there: "a block device", "a character
// device", "a directory", "a FIFO", "a socket".
const char* NodeKind(unsigned mode);

// Parses a size as qemu-img does: a number with an optional fraction and an
// optional binary suffix b/k/M/G/T/P/E (case-insensitive; b = bytes);
// without a suffix the number is bytes. "1.5G", "64k", "4096". Errors
// (kInvalidArgument) name the text: negative, junk, overflow.
Result<uint64_t> ParseSize(std::string_view text);

// -r RATE_LIMIT of convert and commit, as qemu-img takes it: bytes per
// second, written as a size ("10M" is 10 MiB/s); "" or 0 is no limit
// (nullptr). kInvalidArgument naming the text otherwise.
Result<std::unique_ptr<RateLimit>> ParseRateLimit(const std::string& text);

// Parses qemu's "-o key=value,key=value" syntax; ",," is a literal comma in a
// value. A key without '=' gets the value "on" (as qemu's QemuOpts do for
// flags). Later keys override earlier ones; several -o strings may be merged
// by calling this on each and inserting.
using OptionMap = std::map<std::string, std::string>;
Result<OptionMap> ParseOptionString(std::string_view text);

// "on"/"off" (also "true"/"false", "yes"/"no") for option `key`.
Result<bool> ParseOnOff(const std::string& key, const std::string& value);

// qemu's human sizes: "0 B", "4 KiB", "1.5 GiB" (three significant digits).
std::string HumanSize(uint64_t bytes);

// True when every byte of buf is zero.
bool IsAllZero(const uint8_t* buf, size_t size);

// A progress display on stderr, "    (42.00/100%)" redrawn in place like
// qemu-img -p. Does nothing when disabled.
class Progress {
 public:
  explicit Progress(bool enabled);
  ~Progress();
  // Redraws when the percentage moved by at least 0.01 or on completion.
  void Update(uint64_t done, uint64_t total);
  // Ends the line (only if anything was drawn).
  void Finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  double last_percent_ = -1;
};

// One subcommand: registers its flags on the parent app and runs when the
// user chose it. Implementations live in <name>_cmd.cc.
class Subcommand {
 public:
  virtual ~Subcommand() = default;
  // Adds the subcommand and its options to `app`; returns the subcommand.
  virtual CLI::App* Register(CLI::App& app) = 0;
  virtual Result<Outcome> Run() = 0;
  virtual ErrorExit error_exit() const { return ErrorExit::kOne; }
};

std::unique_ptr<Subcommand> NewCreateCommand();
std::unique_ptr<Subcommand> NewInfoCommand();
std::unique_ptr<Subcommand> NewMapCommand();
std::unique_ptr<Subcommand> NewCheckCommand();
std::unique_ptr<Subcommand> NewConvertCommand();
std::unique_ptr<Subcommand> NewCompareCommand();
std::unique_ptr<Subcommand> NewIoCommand();
std::unique_ptr<Subcommand> NewServeCommand();
std::unique_ptr<Subcommand> NewBenchCommand();
std::unique_ptr<Subcommand> NewCommitCommand();
std::unique_ptr<Subcommand> NewRebaseCommand();
std::unique_ptr<Subcommand> NewAmendCommand();
std::unique_ptr<Subcommand> NewSnapshotCommand();
std::unique_ptr<Subcommand> NewBitmapCommand();
std::unique_ptr<Subcommand> NewBackupCommand();
std::unique_ptr<Subcommand> NewResizeCommand();
std::unique_ptr<Subcommand> NewMeasureCommand();
std::unique_ptr<Subcommand> NewCompactCommand();
std::unique_ptr<Subcommand> NewRmCommand();
std::unique_ptr<Subcommand> NewLsCommand();
std::unique_ptr<Subcommand> NewLockCommand();
std::unique_ptr<Subcommand> NewDdCommand();

// Builds the whole `thindisk` app and runs it on argv; returns the exit code.
// Used by main() and by tests.
int RunThindisk(int argc, const char* const* argv);

}  // namespace thindisk::cli
