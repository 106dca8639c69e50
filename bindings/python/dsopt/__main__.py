"""``python -m dsopt``: what this dsopt is built with and which files it uses
(the extension, libdsopt, the MPI plugin), and whether each communicator can
be made here."""

import re
import sys
from pathlib import Path

import dsopt
from dsopt._lib import ffi, lib


def main() -> int:
    info = dsopt.build_info()
    pairs = dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", info))
    print(f"dsopt {dsopt.version()}")
    print(f"  build:      {info}")
    print(f"  package:    {Path(dsopt.__file__).parent}")
    extension = sys.modules.get("dsopt._dsopt_wheel") or sys.modules.get("dsopt._dsopt_cffi")
    print(f"  extension:  {getattr(extension, '__file__', '?')}")
    print(f"  libdsopt:   {dsopt.library_path() or '?'}")
    mpi = pairs.get("mpi", "off")
    print(f"  MPI:        {'off (built without MPI)' if mpi == 'off' else mpi}")
    if mpi == "unavailable":  # the library's own words on what is missing
        comm = ffi.new("dsopt_comm **")
        lib.dsopt_comm_create_mpi(comm, 0)
        print("              " + ffi.string(lib.dsopt_last_error()).decode().replace("\n", "\n              "))
    print(f"  CUDA:       {pairs.get('cuda', '?')}   NCCL: {pairs.get('nccl', '?')}   "
          f"CPU kernels: {pairs.get('simd', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
