// Result<T>: a value or the Status that explains why there is none.
//
// Shaped like C++23 std::expected<T, Status> (g++ 12 has no <expected>), so
// moving to it is a rename: has_value(), operator bool, value(), error(),
// operator* and operator->. A Result is built from a T (success) or from a
// non-OK Status (failure); building one from an OK Status is a bug and
// becomes an kInternal error.
#pragma once

#include <cassert>
#include <type_traits>
#include <utility>
#include <variant>

#include "util/status.h"

namespace thindisk {

template <typename T>
class [[nodiscard]] Result {
 public:
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "use Status");

  Result(const T& value) : v_(value) {}           // NOLINT: implicit by design
  Result(T&& value) : v_(std::move(value)) {}      // NOLINT
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status::Internal("Result built from OK status");
  }
  template <typename U>
    requires(std::is_constructible_v<T, U &&> && !std::is_same_v<std::decay_t<U>, T> &&
             !std::is_same_v<std::decay_t<U>, Status> &&
             !std::is_same_v<std::decay_t<U>, Result>)
  Result(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { assert(has_value()); return std::get<0>(v_); }
  const T& value() const& { assert(has_value()); return std::get<0>(v_); }
  T&& value() && { assert(has_value()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // REQUIRES: !has_value().
  const Status& error() const { assert(!has_value()); return std::get<1>(v_); }
  // The Status: OK when there is a value.
  Status status() const { return has_value() ? Status::Ok() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace thindisk

#define TD_CONCAT_INNER_(a, b) a##b
#define TD_CONCAT_(a, b) TD_CONCAT_INNER_(a, b)

// TD_ASSIGN_OR_RETURN(auto x, Foo()); returns Foo()'s error from the caller.
#define TD_ASSIGN_OR_RETURN(lhs, expr) \
  TD_ASSIGN_OR_RETURN_IMPL_(TD_CONCAT_(td_result_, __LINE__), lhs, expr)
#define TD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.has_value()) return tmp.error();       \
  lhs = std::move(tmp).value()
