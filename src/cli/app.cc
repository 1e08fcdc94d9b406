// The thindisk command line: one CLI11 app with a subcommand per file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "cli/common.h"

#ifndef THINDISK_VERSION
#define THINDISK_VERSION "unknown"
#endif

namespace thindisk::cli {

int RunThindisk(int argc, const char* const* argv) {
  CLI::App app{"thindisk: thin-provisioned copy-on-write qcow2 and raw disk images"};
  app.name("thindisk");
  app.set_version_flag("--version", "thindisk version " THINDISK_VERSION);
  app.require_subcommand(1);
  std::vector<std::unique_ptr<Subcommand>> commands;
  commands.push_back(NewCreateCommand());
  commands.push_back(NewInfoCommand());
  commands.push_back(NewMapCommand());
  commands.push_back(NewCheckCommand());
  commands.push_back(NewConvertCommand());
  commands.push_back(NewCompareCommand());
  commands.push_back(NewDdCommand());
  commands.push_back(NewIoCommand());
  commands.push_back(NewServeCommand());
  commands.push_back(NewBenchCommand());
  commands.push_back(NewCommitCommand());
  commands.push_back(NewRebaseCommand());
  commands.push_back(NewAmendCommand());
  commands.push_back(NewSnapshotCommand());
  commands.push_back(NewBitmapCommand());
  commands.push_back(NewBackupCommand());
  commands.push_back(NewResizeCommand());
  commands.push_back(NewMeasureCommand());
  commands.push_back(NewCompactCommand());
  commands.push_back(NewRmCommand());
  commands.push_back(NewLsCommand());
  commands.push_back(NewLockCommand());
  std::vector<CLI::App*> subs;
  for (auto& c : commands) subs.push_back(c->Register(app));

  // CLI11 reports parse outcomes (including --help) as exceptions; they stop
  // here, so nothing below the command line throws.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return ExitCodeFor(Status::InvalidArgument(std::string(e.what()) + " (try --help)"),
                       ErrorExit::kOne);
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    if (subs[i]->parsed()) {
      Result<Outcome> result = commands[i]->Run();
      std::fflush(stdout);
      return ExitCodeFor(result, commands[i]->error_exit());
    }
  }
  return ExitCodeFor(Status::InvalidArgument("no subcommand given (try --help)"), ErrorExit::kOne);
}

}  // namespace thindisk::cli
