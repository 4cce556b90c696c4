"""Runs a study server in its own process for tests/test_study_process.py.

The server is scope's own (``serve``: uvicorn, the real app, a real SQLite file); only the agent is a
stand-in: a scripted model that takes DELAY seconds per reply, so a test can kill the server while a
reply is being generated.

    python tests/study_launcher.py STUDY.yaml DB PORT DELAY
"""

import sys
import time

from scope_marl.assembly import ModelCache
from scope_marl.backends.scripted import ScriptedChatModel
from scope_marl.config.study import load_study
from scope_marl.study.server import serve


def main() -> None:
    config, db, port, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

    def reply(prompt):
        time.sleep(delay)
        turns = sum(m.role == "user" for m in prompt)
        return f"Reply {turns}: would you give $1 to Save the Children?"

    models = ModelCache()
    models.register("slow", ScriptedChatModel(reply, name="slow"))
    serve(load_study(config), db, port=port, models=models, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
