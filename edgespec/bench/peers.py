"""llama-cpp-python's own loops on the target file, plain and with its prompt lookup, as the bench's peers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.bench.measure import spread
from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.sampling import SamplingParams


class Peer:
    """llama-cpp-python's high-level ``Llama`` on the target file, with or without its prompt-lookup drafting.

    Its loop is observed from outside: ``eval`` is wrapped to count target decodes and ``generate`` to stamp each
    token as it comes out, so the tokens sampled after the same eval form one round.
    """

    def __init__(self, path: Path, *, n_ctx: int, n_threads: int, n_gpu_layers: int, lookup_len: int = 0) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        class CountingLookup(LlamaPromptLookupDecoding):
            drafted = 0

            def __call__(self, input_ids, /, **kwargs):
                out = super().__call__(input_ids, **kwargs)
                self.drafted += len(out)
                return out

        self.drafter = CountingLookup(num_pred_tokens=lookup_len) if lookup_len else None
        # logits_all must be explicit with a draft model: 0.3.36 turns it on internally but sizes the logits
        # buffer by the argument, n_batch rows, and fails once a context outgrows n_batch.
        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_gpu_layers=n_gpu_layers,
            draft_model=self.drafter,
            logits_all=self.drafter is not None,
            verbose=False,
        )
        self.evals = 0
        self.stamps: list[tuple[float, int]] = []  # (time, evals so far) per generated token
        eval_, generate = self.llm.eval, self.llm.generate

        def counted_eval(tokens):
            self.evals += 1
            return eval_(tokens)

        def stamped_generate(*args, **kwargs):
            for token in generate(*args, **kwargs):
                self.stamps.append((time.perf_counter(), self.evals))
                yield token

        # Instance attributes shadow the methods that create_completion and generate call.
        self.llm.eval = counted_eval
        self.llm.generate = stamped_generate

    def measure(self, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        self.evals = 0
        self.stamps = stamps = []
        drafted0 = self.drafter.drafted if self.drafter else 0
        t0 = time.perf_counter()
        pieces, finish = [], "length"
        for chunk in self.llm.create_completion(
            prompt=list(prompt),
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
            repeat_penalty=1.0,
            seed=params.seed,
            stream=True,
        ):
            choice = chunk["choices"][0]
            pieces.append(choice["text"])
            finish = choice["finish_reason"] or finish
        if not stamps:
            raise EdgespecError("llama-cpp-python generated nothing")
        # The first token is sampled from the prompt's own eval, so it belongs to the prefill.
        times: list[float] = []
        rounds = accepted = 0
        t_mark, i = stamps[0][0], 1
        while i < len(stamps):
            j = i
            while j < len(stamps) and stamps[j][1] == stamps[i][1]:
                j += 1
            spread(times, stamps[j - 1][0] - t_mark, j - i)
            rounds, accepted, t_mark, i = rounds + 1, accepted + (j - i - 1), stamps[j - 1][0], j
        return dict(
            generated=len(stamps),
            decode_tokens=len(stamps) - 1,
            t_prefill=stamps[0][0] - t0,
            t_decode=stamps[-1][0] - stamps[0][0],
            t_outside=None,
            rounds=rounds,
            drafted=(self.drafter.drafted - drafted0) if self.drafter else 0,
            accepted=accepted,
            finish_reason="eos" if finish == "stop" else finish,
            text="".join(pieces),
            token_times=times,
        )

    def close(self) -> None:
        self.llm.close()
