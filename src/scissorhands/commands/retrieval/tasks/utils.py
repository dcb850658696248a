"""lm-eval's hooks for the package's tasks (their YAMLs name these with ``!function``):
each task's generator (:mod:`scissorhands.commands.retrieval.data`) and the per-sample score."""

from scissorhands.commands.retrieval.data import from_metadata, score

sh_later_turn = from_metadata("sh_later_turn")
sh_fact_once = from_metadata("sh_fact_once")
sh_fact_restated = from_metadata("sh_fact_restated")
sh_prose_needle = from_metadata("sh_prose_needle")


def process_results(doc, results):
    """``score``: the share of the sample's numbers in the generated answer."""
    return {"score": score(doc, results[0])}
