// ThreadSanitizer's built-in suppressions, linked into every program of a -fsanitize=thread build
// (CMakeLists.txt adds this file to those builds only), so that `ctest` in build-tsan, test.sh and
// a hand-run binary all judge the same reports. docs/RELIABILITY.md ("TSan and the HTTP library")
// has the evidence.
//
// Debian ships cpp-httplib as a compiled, uninstrumented libcpp-httplib.so; its source (the
// single-header httplib.h) is in no package CI can install, and the project vendors no code.
// Function-local statics inside that library -- Server::parse_request_line's set of method names,
// write_content_chunked's "0\r\n\r\n" -- are built by the first HTTP worker thread that reaches
// them, under __cxa_guard_acquire/__cxa_guard_release, which TSan intercepts. Every later worker
// takes the guard's inline fast path instead: a plain load of the guard byte in uninstrumented
// code, the acquire that TSan cannot see. The library's own memcmp over the set's nodes, or
// strata's send() of the marker's bytes, then look unordered against the first worker's
// allocation or memcpy: a report that names two httplib worker threads and no strata data. Built
// against the same httplib.h compiled with -fsanitize=thread, the reports do not occur.
//
// called_from_lib makes TSan ignore the memory accesses of the libc calls (memcmp, memcpy,
// operator new, ...) that this library makes itself, as it already cannot see the library's
// plain loads and stores. It hides nothing of strata's: every access strata's code makes is still
// checked, including every byte the library sends (it goes through strata's ConnectionStream),
// and synchronization made through the library's calls is still modelled.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libcpp-httplib.so\n";
}
