"""Real replicated Redis topologies for the tests, from Debian's ``redis-server``.

- :func:`redis_cluster`: six nodes, three masters each with one replica
  (``redis-cli --cluster create --cluster-replicas 1``).
- :func:`redis_sentinel`: a master, one replica and three sentinels watching
  them under the name ``fairpost``.

Failure detection is quick but sane (``cluster-node-timeout`` and Sentinel's
``down-after-milliseconds``: 2 s), so a failover test sees a replica promoted
within seconds even on a busy machine. Every process is stopped (and its
directory removed) when the block ends, whatever happened in it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import redis

from fairpost.mailer.testing.services import die_with_parent, free_port
from fairpost.mailer.testing.wait import wait_for

NODE_TIMEOUT_MS = 2000
"""cluster-node-timeout and down-after-milliseconds: small enough for a test,
large enough that a loaded machine's pauses are not taken for a failure."""

SENTINEL_MASTER = "fairpost"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (Debian: apt-get install redis-server)")
    return path


@dataclass
class Node:
    """One redis-server (data node or sentinel) this module started."""

    port: int
    workdir: Path
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last save, as a crashed host."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2, **kwargs)  # type: ignore[arg-type]

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def log(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _replica_online(info: dict[str, object]) -> bool:
    """A master's INFO replication shows a replica done with its first sync."""
    replica = info.get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


def _data_node(root: Path, name: str, *extra: str) -> Node:
    port = free_port()
    workdir = root / name
    workdir.mkdir()
    argv = [
        _binary("redis-server"),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
        "--logfile", str(workdir / "redis.log"),
        # A replica's first sync starts at once, not after the default 5 s wait.
        "--repl-diskless-sync-delay", "0",
        *extra,
    ]  # fmt: skip
    return Node(port, workdir, argv)


@dataclass
class Cluster:
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Any node names the cluster: the first one."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=2)

    def node_for(self, key: str) -> Node:
        """The node that is master of ``key``'s slot now."""
        slot = self._slot(key)
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client() as client:
                    for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                        if int(start) <= slot <= int(end):
                            return self._by_port(int(master[1]))
            except redis.RedisError:
                continue
        raise AssertionError(f"no node answers for slot {slot}")

    def _by_port(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def _slot(self, key: str) -> int:
        with self.nodes[0].client() as client:
            return int(client.execute_command("CLUSTER KEYSLOT", key))

    def healthy(self) -> bool:
        """Every running node says cluster_state:ok and all 16384 slots are served."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client() as client:
                    info = client.execute_command("CLUSTER INFO")
            except redis.RedisError:
                return False
            # redis-py parses CLUSTER INFO into a dict of strings.
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                return False
        return True

    def replicated(self) -> bool:
        """Healthy, and every master has a replica in sync (so a failover has one to promote)."""
        if not self.healthy():
            return False
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client() as client:
                    info = client.info("replication")
            except redis.RedisError:
                return False
            if info.get("role") == "master" and not _replica_online(info):
                return False
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def flush(self) -> None:
        with self.client() as client:
            client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)


@contextmanager
def redis_cluster(masters: int = 3) -> Iterator[Cluster]:
    """A real Redis Cluster: ``masters`` masters, each with one replica."""
    with tempfile.TemporaryDirectory(prefix="fairpost-cluster-") as tmp, ExitStack() as stack:
        cluster = Cluster()
        for i in range(masters * 2):
            node = _data_node(
                Path(tmp), f"node{i}",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # The bus port defaults to port + 10000: past 65535 for a high free port.
                "--cluster-port", str(free_port()),
                # A replica however long cut off may still take over: the test kills
                # its master right after a burst of writes.
                "--cluster-replica-validity-factor", "0",
            )  # fmt: skip
            cluster.nodes.append(node)
            node.start()
            stack.callback(node.stop)
        for node in cluster.nodes:
            wait_for(node.answers, within=30, what=f"cluster node {node.port} to answer")
        created = subprocess.run(
            [
                _binary("redis-cli"), "--cluster", "create",
                *[f"127.0.0.1:{node.port}" for node in cluster.nodes],
                "--cluster-replicas", "1", "--cluster-yes",
            ],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        wait_for(cluster.replicated, within=30, what="every slot served and replicated", interval=0.2)
        yield cluster


@dataclass
class SentinelGroup:
    master: Node
    replica: Node
    sentinels: list[Node]

    @property
    def sentinel_addresses(self) -> str:
        """FAIRPOST_REDIS_SENTINELS for this group."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels)

    @property
    def data_nodes(self) -> list[Node]:
        return [self.master, self.replica]

    def current_master(self) -> Node:
        """The data node the sentinels name as master now."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            try:
                with sentinel.client() as client:
                    _, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER)
            except (redis.RedisError, ValueError, TypeError):
                continue
            return next(node for node in self.data_nodes if node.port == int(port))
        raise AssertionError("no sentinel answers")

    def replicated(self) -> bool:
        """The master has its replica online and the sentinels see both."""
        try:
            with self.current_master().client() as client:
                info = client.info("replication")
            if not _replica_online(info):
                return False
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    state = client.sentinel_master(SENTINEL_MASTER)  # parsed by redis-py
                if int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
                if int(state["num-slaves"]) < 1:
                    return False
        except (redis.RedisError, AssertionError, KeyError):
            return False
        return True

    def flush(self) -> None:
        with self.current_master().client() as client:
            client.flushall()


@contextmanager
def redis_sentinel() -> Iterator[SentinelGroup]:
    """A master, its replica, and three sentinels (quorum 2) watching them."""
    with tempfile.TemporaryDirectory(prefix="fairpost-sentinel-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        master = _data_node(root, "master")
        replica = _data_node(root, "replica", "--replicaof", "127.0.0.1", str(master.port))
        for node in (master, replica):
            node.start()
            stack.callback(node.stop)
            wait_for(node.answers, within=30, what=f"redis-server {node.port} to answer")
        sentinels = []
        for i in range(3):
            port = free_port()
            workdir = root / f"sentinel{i}"
            workdir.mkdir()
            conf = workdir / "sentinel.conf"  # Sentinel rewrites its file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {workdir}\nlogfile {workdir / 'redis.log'}\n"
                f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_MASTER} {NODE_TIMEOUT_MS}\n"
                f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n"
                f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
            )
            node = Node(port, workdir, [_binary("redis-server"), str(conf), "--sentinel"])
            node.start()
            stack.callback(node.stop)
            sentinels.append(node)
        group = SentinelGroup(master, replica, sentinels)
        for node in sentinels:
            wait_for(node.answers, within=30, what=f"sentinel {node.port} to answer")
        wait_for(group.replicated, within=30, what="the sentinels to see master and replica", interval=0.2)
        yield group


def restart(node: Node) -> None:
    """Start a killed node again on its port and directory (it rejoins as a replica)."""
    with suppress(Exception):
        node.stop()
    node.start()
    wait_for(node.answers, within=10, what=f"redis-server {node.port} to answer again")
