// A per-thread object that code running after the thread's thread-locals were destroyed can still
// use. At exit glibc destroys the exiting thread's thread-locals before the atexit handlers and
// static destructors run, and those may still call in (PyTorch's teardown of communicators calls
// NCCL, so the shim): a plain thread_local would be used after its destructor. Until then, the
// thread's own T, destroyed with the thread; afterwards a fresh T for the rest of the thread's life,
// never freed (only a thread that calls in after its destructors ran makes one, while it exits).
// `Tag` tells apart two uses of one type.
#pragma once

namespace symmem::detail {

template <class T, class Tag = T>
T& exit_safe_thread_local() {
  // Both trivially destructible: readable for as long as the thread lives.
  static thread_local bool gone = false;
  static thread_local T* after = nullptr;
  if (!gone) {
    struct Holder {
      T value{};
      Holder() = default;
      Holder(const Holder&) = delete;
      Holder& operator=(const Holder&) = delete;
      ~Holder() { gone = true; }
    };
    thread_local Holder holder;
    return holder.value;
  }
  if (!after) after = new T();
  return *after;
}

}  // namespace symmem::detail
