/* Preloaded into the MPI ranks of the sanitizer runs (LD_PRELOAD; see
 * `make test-sanitize`): dlclose() becomes a no-op, so the libraries a
 * process dlopen()s stay mapped until it exits.
 *
 * Why: Open MPI loads its plugins (mca_*.so, PMIx, hwloc components) with
 * dlopen and unloads them in MPI_Finalize. LeakSanitizer reports leaks at
 * exit, after that unloading, so every frame inside a plugin would show as
 * "<unknown module>" and no suppression could tell Open MPI's own leaks from
 * anything else. With the plugins still mapped, each frame carries its
 * library's name and tests/sanitize/lsan.supp can name those libraries.
 * Nothing else changes: a library that is never unloaded behaves the same
 * while the process lives. */
int dlclose(void *handle);

int dlclose(void *handle) {
  (void)handle;
  return 0;
}
