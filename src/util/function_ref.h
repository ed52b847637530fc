// FunctionRef<R(Args...)>: a non-owning reference to a callable (two pointers, never allocates), for APIs that
// call a function only during the call itself (the thread pool's run / parallel_for). std::function would
// heap-allocate for lambdas with more than two pointers of captures, which a step's execute() must not do.
// The referenced callable must outlive the call it is passed to.
#pragma once

#include <type_traits>
#include <utility>

namespace kiln {

template <class Sig>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...); }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace kiln
