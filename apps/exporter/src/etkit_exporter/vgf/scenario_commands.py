"""A scenario's commands (``ScenarioCommands``, between ``ScenarioMemory`` and
``ScenarioBuilder``): each dispatch in program order with the memory barriers it needs before
it (a read after a write in another stage, a write after a read or a write), one barrier
resource per distinct pair of stage and access, and the final barrier that makes the outputs
visible to their reader."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etkit_exporter.vgf.scenario_format import ACCESS, BARRIER_COMMAND, Resource, Stage
from etkit_exporter.vgf.scenario_memory import ScenarioMemory
from etkit_pterunner import MethodInfo


class ScenarioCommands(ScenarioMemory):
    def __init__(self, method: MethodInfo, io_params: Mapping[str, Any] | None) -> None:
        super().__init__(method, io_params)
        self.commands: list[dict[str, Any]] = []
        self.dispatches: list[dict[str, Any]] = []
        self.barrier_uses: list[dict[str, Any]] = []
        self.barrier_uids: dict[tuple[str, str, str, str], str] = {}

    def barrier(self, src: tuple[str, str], dst: tuple[str, str]) -> str:
        key = (src[0], ACCESS[src], dst[0], ACCESS[dst])
        uid = self.barrier_uids.get(key)
        if uid is None:
            uid = self.unique(f"barrier_{key[1]}_to_{key[3]}")
            self.barrier_uids[key] = uid
        return uid

    def dispatch(
        self,
        stage: Stage,
        command: dict[str, Any],
        reads: list[Resource],
        writes: list[Resource],
        description: dict[str, Any],
    ) -> None:
        needed: list[str] = []
        read_storages = {r.storage: self.storages[r.storage] for r in reads}
        write_storages = {r.storage: self.storages[r.storage] for r in writes}
        for storage in read_storages.values():
            if storage.last_write is not None and stage not in storage.visible_to:
                needed.append(self.barrier((storage.last_write, "write"), (stage, "read")))
        for storage in write_storages.values():  # a value written twice: order the writes
            if storage.last_write is not None:
                needed.append(self.barrier((storage.last_write, "write"), (stage, "write")))
            for reader in storage.readers:
                needed.append(self.barrier((reader, "read"), (stage, "write")))
        needed = list(dict.fromkeys(needed))
        if needed:
            self.emit_barrier(
                needed,
                f"before dispatch {len(self.dispatches)} ({description['command']} of delegate "
                f"{description['delegate']}, instruction {description['instruction']})",
            )
        for resource in reads:
            resource.reads = True
        for resource in writes:
            resource.writes = True
        for storage in read_storages.values():
            storage.readers.add(stage)
        for storage in write_storages.values():
            storage.last_write = stage
            storage.visible_to = set()
            storage.readers = set()
        description["reads"] = sorted({r.uid for r in reads})
        description["writes"] = sorted({r.uid for r in writes})
        self.dispatches.append(description)
        self.commands.append(command)

    def emit_barrier(self, uids: list[str], why: str) -> None:
        self.commands.append(
            {
                BARRIER_COMMAND: {
                    "image_barrier_refs": [],
                    "tensor_barrier_refs": [],
                    "memory_barrier_refs": uids,
                    "buffer_barrier_refs": [],
                }
            }
        )
        self.barrier_uses.append({"command": len(self.commands) - 1, "barriers": uids, "why": why})
        made = {uid: key for key, uid in self.barrier_uids.items()}
        for uid in uids:
            src_stage, src_access, dst_stage, _ = made[uid]
            if not src_access.endswith("write"):
                continue
            for storage in self.storages.values():
                if storage.last_write == src_stage:
                    storage.visible_to.add(dst_stage)

    def final_barrier(self) -> None:
        """After the last dispatch, every write made visible to every read: the results, for
        whoever reads them next (the host, a frame)."""
        if self.dispatches:
            final = self.unique("barrier_all_writes_to_all_reads")
            self.barrier_uids[("all", "memory_write", "all", "memory_read")] = final
            self.emit_barrier([final], "after the last dispatch: the outputs, for the reader")

    def barrier_resources(self) -> list[dict[str, Any]]:
        """The scenario's memory barrier resources, one per distinct barrier used."""
        barrier_resources = []
        for (src_stage, src_access, dst_stage, dst_access), uid in self.barrier_uids.items():
            barrier_resources.append(
                {
                    "memory_barrier": {
                        "uid": uid,
                        "src_access": src_access,
                        "dst_access": dst_access,
                        "src_stage": [src_stage],
                        "dst_stage": [dst_stage],
                    }
                }
            )
        return barrier_resources
