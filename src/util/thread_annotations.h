// Clang's thread-safety attributes, as macros that vanish for other
// compilers. With them a lock's contract is in the code: which mutex guards
// a member (TD_GUARDED_BY), which a function needs held (TD_REQUIRES), which
// it takes or lets go (TD_ACQUIRE, TD_RELEASE). Clang's -Wthread-safety
// then rejects an access to guarded state without its lock: every clang
// build of this tree passes it, and since the builds use g++ (which
// ignores the attributes) the util.thread_annotations test runs the
// analysis over the libraries whose locks are annotated. The capabilities
// themselves are util::Mutex and its holders (util/mutex.h): std::mutex
// carries no attributes in libstdc++, so a std::lock_guard proves nothing
// to the analysis.
//
// What the analysis does not follow: a capability passed out of a function
// (a lock moved into a struct), aliases (a reference taken under the lock
// and used after it), and lambdas unless annotated (their body is another
// function: `[&]() TD_REQUIRES(mu_) { ... }` is checked where it is called).
// Code that does the others says so, or takes the contract into a narrower
// function.
#pragma once

#if defined(__clang__)
#define TD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TD_THREAD_ANNOTATION(x)
#endif

// On a class: it is a lock ("mutex").
#define TD_CAPABILITY(x) TD_THREAD_ANNOTATION(capability(x))
// On a class: an object of it holds a lock from construction to destruction.
#define TD_SCOPED_CAPABILITY TD_THREAD_ANNOTATION(scoped_lockable)
// On a member: read or written only with the lock held.
#define TD_GUARDED_BY(x) TD_THREAD_ANNOTATION(guarded_by(x))
// On a pointer member: what it points at is used only with the lock held.
#define TD_PT_GUARDED_BY(x) TD_THREAD_ANNOTATION(pt_guarded_by(x))
// On a function: the caller holds these.
#define TD_REQUIRES(...) TD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: it takes (or lets go of) these and returns so.
#define TD_ACQUIRE(...) TD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TD_RELEASE(...) TD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// On a function: the caller must not hold these (it takes them itself).
#define TD_EXCLUDES(...) TD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: not analysed. Each use says why the contract holds anyway.
#define TD_NO_THREAD_SAFETY_ANALYSIS TD_THREAD_ANNOTATION(no_thread_safety_analysis)
