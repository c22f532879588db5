"""``python -m tests.helpers.standin_predictor PORT``: the predictor (trainer/serve/predictor.py: KServe's model
server, its gate and routes) around a stand-in engine, in .venv-serve. The stand-in answers a query ending in a
number N with N documents, as PLAID answers with fewer than k; a line ``stop`` on stdin unloads the model as
KServe's model repository does (``Model.stop``), and ``stopped`` is printed once it has."""

from __future__ import annotations

import sys
import threading


class StandInEngine:
    """As :class:`trainer.serve.engine.Engine` answers, without a model: ``documents`` ids, d0 the best."""

    documents = 50

    def search(self, queries: list[str], k: int) -> list[tuple[list[str], list[float]]]:
        found = [min(k, int(q.split()[-1]) if q.split()[-1].isdigit() else k) for q in queries]
        return [([f"d{i}" for i in range(n)], [float(100 - i) for i in range(n)]) for n in found]

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        return [float(len(d)) for d in documents]

    def answer(self, requests: list) -> list:
        """A batch as the engine answers one (trainer/serve/batcher.py calls it): each request alone."""
        from trainer.serve.requests import Rerank

        return [
            self.rerank(r.query, r.documents) if isinstance(r, Rerank) else self.search(r.queries, r.k)
            for r in requests
        ]

    @property
    def stages(self) -> tuple:
        """As the engine's: a first stage that hands each request on, then :meth:`answer`."""
        return (list, self.answer)

    def describe(self) -> str:
        return f"a stand-in of {self.documents} documents"


def main() -> None:
    from trainer.serve.predictor import make_model, serve

    model = make_model("colbert", StandInEngine)
    model.load()

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                model.stop()
                print("stopped", flush=True)

    threading.Thread(target=watch, daemon=True).start()
    serve(model, "127.0.0.1", int(sys.argv[1]))


if __name__ == "__main__":
    main()
