"""How many steps verl's SFT trainer will run, computed exactly as ``fsdp_sft_trainer`` does.

verl 0.6.1 builds the SFT loader as ``DistributedSampler(num_replicas=dp, drop_last=True)`` and
``StatefulDataLoader(batch_size=train_batch_size // dp, drop_last=True)``, where ``dp`` is the
data-parallel size (devices / ulysses_sequence_parallel_size), so one epoch is
``floor(floor(rows / dp) / (batch / dp))`` steps and the run is that times ``total_epochs``
(``trainer.total_training_steps`` is never rendered). The stage entrypoint uses the plan three
ways: the default save frequency (one save per epoch), the epoch-boundary resume guard
(``retool.runtime.sft_resume``), and the success check (the final checkpoint must be the last step).
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.spec.model import RetoolRunSpec


class SFTPlanError(ValueError):
    """The prepared SFT data cannot fill one step; the message says what to change."""


@dataclass(frozen=True)
class SFTPlan:
    rows: int
    data_parallel: int
    per_rank_batch: int
    steps_per_epoch: int
    epochs: int
    save_freq: int
    """The resolved ``trainer.save_freq``: the spec's, else one save per epoch."""

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def at_epoch_boundary(self, step: int) -> bool:
        return 0 < step < self.total_steps and step % self.steps_per_epoch == 0


def sampler_samples(rows: int, replicas: int) -> int:
    """``len(DistributedSampler(dataset, num_replicas, drop_last=True))``: the samples one rank sees per epoch."""
    if rows % replicas:
        return -(-(rows - replicas) // replicas)  # math.ceil((rows - replicas) / replicas), as torch writes it
    return rows // replicas


def sft_plan(spec: RetoolRunSpec, rows: int) -> SFTPlan:
    """The plan of the SFT stage for ``rows`` prepared trajectories."""
    sft, hw = spec.sft, spec.hardware
    devices = hw.nodes * hw.devices_per_node
    data_parallel = devices // sft.sequence_parallel
    per_rank = sft.batch_size // data_parallel
    steps = sampler_samples(rows, data_parallel) // per_rank if rows >= data_parallel else 0
    if steps == 0:
        raise SFTPlanError(
            f"the SFT data has {rows} trajectories, fewer than one step of sft.batchSize {sft.batch_size} "
            f"({per_rank} on each of {data_parallel} data-parallel ranks, incomplete batches dropped): add data or lower sft.batchSize"
        )
    save_freq = steps if sft.save_freq is None else sft.save_freq
    return SFTPlan(rows=rows, data_parallel=data_parallel, per_rank_batch=per_rank, steps_per_epoch=steps, epochs=sft.epochs, save_freq=save_freq)


def parquet_rows(path: str) -> int:
    """Rows of the prepared SFT parquet (its footer only)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows
