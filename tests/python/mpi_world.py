"""MPI for the multi-rank scripts: mpi4py when importable, else libmpi via
ctypes (Open MPI: MPI_COMM_WORLD is the address of ompi_mpi_comm_world).

``world()`` returns (dsopt.Communicator, rank, size, finalize, abort)."""

import ctypes
import ctypes.util
import os

import dsopt


def _with_mpi4py():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    # mpi4py finalises MPI at exit by itself.
    return (dsopt.Communicator.from_mpi4py(comm), comm.Get_rank(), comm.Get_size(),
            lambda: None, lambda code: comm.Abort(code))


def _with_ctypes():
    name = ctypes.util.find_library("mpi") or "libmpi.so.40"
    libmpi = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)  # global: Open MPI's plugins need it
    if libmpi.MPI_Init(None, None) != 0:
        raise RuntimeError("MPI_Init failed")
    world = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(libmpi, "ompi_mpi_comm_world")))
    libmpi.MPI_Comm_c2f.restype = ctypes.c_int
    libmpi.MPI_Comm_c2f.argtypes = [ctypes.c_void_p]
    rank, size = ctypes.c_int(), ctypes.c_int()
    libmpi.MPI_Comm_rank(world, ctypes.byref(rank))
    libmpi.MPI_Comm_size(world, ctypes.byref(size))
    comm = dsopt.Communicator.from_fortran_handle(libmpi.MPI_Comm_c2f(world))
    return (comm, rank.value, size.value, lambda: libmpi.MPI_Finalize(),
            lambda code: libmpi.MPI_Abort(world, code))


def world():
    if os.environ.get("DSOPT_TEST_MPI") != "ctypes":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            pass
        else:
            return _with_mpi4py() + ("mpi4py",)
    return _with_ctypes() + ("ctypes",)
