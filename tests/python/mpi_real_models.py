"""Run under ``mpirun -np P`` by test_real_models.py (through
training_runs.run_under_mpirun): ``mpi_real_models.py SPECS OUT_DIR``."""

import sys

import training_runs

if __name__ == "__main__":
    training_runs.mpi_worker_main(*sys.argv[1:])
