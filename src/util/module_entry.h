// The module side of util/module_loader.h: what a module's one exported
// entry answers. Each module's entry is
//
//   extern "C" __attribute__((visibility("default"))) const Table* NAME(
//       const Layout& caller, Layout* own) {
//     return util::AnswerLoader(caller, own, kTable);
//   }
//
// where Layout is the module's record of what the binary and it exchange
// (an ABI number, then the sizes of the types; it has operator==).
#pragma once

namespace thindisk::util {

// `table` when the caller's layout is this build's, else nullptr; `*own`
// (when given) gets this build's layout, for the caller's message.
template <typename Table, typename Layout>
const Table* AnswerLoader(const Layout& caller, Layout* own, const Table& table) {
  const Layout mine;
  if (own) *own = mine;
  return caller == mine ? &table : nullptr;
}

}  // namespace thindisk::util
