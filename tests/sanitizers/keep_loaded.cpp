// Linked into every test executable of a sanitized build (tests/CMakeLists.txt): dlclose() does nothing, so that the
// shared objects a process loads stay mapped until it exits.
//
// Open MPI loads its components (mca_*.so) with dlopen() and unloads them at MPI_Finalize. LeakSanitizer reports at
// exit, after that, and the allocations MPI keeps by design (tests/sanitizers/lsan_mpi.supp) were made in those
// components: with them unmapped, their frames are "<unknown module>", which no suppression can name. Unwinding every
// allocation's whole stack (fast_unwind_on_malloc=0) reached a named library further down, but made the
// allocation-heavy suites 15x slower under the sanitizers; with the components still mapped, the fast unwinder's first
// frame names them. The executable's definition takes the place of libc's for every library it loads.
extern "C" int dlclose(void* /*handle*/) { return 0; }
