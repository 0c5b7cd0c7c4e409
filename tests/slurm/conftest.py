"""Makes the ``slurm_cluster`` session fixture available to the tests in this directory."""

from tests.slurm.cluster import slurm_cluster  # noqa: F401
