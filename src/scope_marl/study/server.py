"""A study server from a study file and a database: the objects, and uvicorn running them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scope_marl.assembly import ModelCache
from scope_marl.config.study import StudyConfig
from scope_marl.study.agents import Conditions
from scope_marl.study.app import create_app
from scope_marl.study.replies import ReplyWorker
from scope_marl.study.store import Store


@dataclass
class StudyServer:
    config: StudyConfig
    store: Store
    worker: ReplyWorker
    app: object  # the ASGI app
    resumed: int  # conversations that were waiting for the agent when the server started

    def close(self) -> None:
        self.worker.stop()
        self.app.state.donations.close()
        self.store.close()


def build_server(config: StudyConfig, db: str | Path, models: ModelCache | None = None) -> StudyServer:
    """Load every condition's agent, open the database and start the reply worker (which first queues
    every conversation left waiting for the agent: a restarted server resumes them)."""
    store = Store(db)
    conditions = Conditions(config, models)
    worker = ReplyWorker(store, conditions, config.sampling, config.limits.queue, config.seed)
    resumed = worker.start()
    return StudyServer(config, store, worker, create_app(config, store, conditions, worker), resumed)


def serve(
    config: StudyConfig,
    db: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    invite: int = 0,
    models: ModelCache | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Run the study until interrupted; prints the admin key and any new invitation links first."""
    import uvicorn

    server = build_server(config, db, models)
    base = f"http://{host}:{port}"
    log(f"study {config.title!r}: {len(config.conditions)} condition(s), database {db}; resumed {server.resumed} open conversation(s)")
    log(f"admin: {base}/admin  (admin key: {server.store.secret('admin_key')})")
    for token in server.store.invite(invite) if invite else []:
        log(f"invite: {base}/s/{token}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvicorn.run(server.app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        server.close()
