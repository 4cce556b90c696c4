"""The human study: real people chat with trained agents in a browser (``scope study``).

store.py (SQLite, WAL, every change one transaction) <- agents.py (conditions as loaded agents, the
agent's prompt) <- replies.py (one worker thread: batched, streamed generation) <- app.py (FastAPI
routes, limits, refusals) <- server.py (build and run); report.py reads a database into a report.
FastAPI, uvicorn and sse-starlette come with the ``study`` extra and are imported only here.
"""
