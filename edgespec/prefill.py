"""Prompts into the KV: which prompt tokens each step carries, prefixes copied between lanes, and the start of a
request's rounds once its prompt is in.

A request's own prefill state (where it began, what is left, the prompt's scored rows) is its
:class:`~edgespec.generation.Generation`'s; this module decides, for the engine's step, what of every request still
prefilling goes into the step's decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgespec.models.slot import KVModel, Part, common_prefix

if TYPE_CHECKING:
    from edgespec.calibrate import Calibration
    from edgespec.generation import Generation, Lane

# Prompt tokens a step carries for each request still prefilling while others are in rounds (the earliest request's
# first): on a 2-core CPU ~2 s of the 1.5B's prefill (~17 ms a token), so a long prompt delays the others' tokens
# by that much a step, not by the whole prompt.
PREFILL_CHUNK = 128
# A prompt prefix another lane holds is copied from it when at least this long: the copy moves a whole KV buffer
# (llama.cpp copies no less between sequences), which costs about what decoding a few dozen tokens does.
MIN_SHARED_PREFIX = 64


class Prefill:
    """The engine's prompts on their way into the lanes' KV."""

    def __init__(self, target: KVModel, lanes: list[Lane], calibration: Calibration) -> None:
        self.target = target
        self._lanes = lanes
        self._calibration = calibration

    def parts(
        self, joining: list[Generation], others_in_rounds: bool
    ) -> tuple[list[tuple[Generation, Part]], list[Generation]]:
        """The next prompt chunk of the requests still prefilling, first come first served; and the requests whose
        rounds begin in this step's decode (:meth:`Generation.open_with_prompt_tail`: their chunk ends the prompt,
        and their first verify follows it in the decode).

        With no request in rounds, the earliest prompt goes in whole and alone: its first token comes when its own
        prefill ends, not when those of every prompt that arrived with it end too (prompts prefilled side by side
        all wait for the last of them). Beside requests in rounds, a step carries :data:`PREFILL_CHUNK` prompt
        tokens for each request prefilling, so that a long prompt delays the others' next tokens by about that
        much a step, not by the whole prompt; they go to the earliest request first, and the next one's prompt
        begins where the earliest one's ends. A bit-exact target, and a prompt to be scored, prefill on a decode
        of their own (bit-exact: the whole prompt, for its KV to round as a lone request's does)."""
        parts, opening = [], []
        bit_exact = self.target.bit_exact
        whole = self.target.n_batch * 64
        # Prompt tokens this step still carries: None while no request has been given any (with none in rounds,
        # the first is given its whole prompt and the rest wait for the next step).
        budget: int | None = PREFILL_CHUNK * len(joining) if others_in_rounds else None
        for generation in joining:
            own_decode = bit_exact or generation.scores_prompt
            if budget == 0 and not own_decode:
                continue  # its turn comes when those before it are in
            try:
                if not generation.prefill_begun and not generation.scores_prompt and generation.cache_prompt:
                    self._share_prefix(generation)
                if own_decode:
                    # Bit-exact, the whole prompt as a lone request prefills it; scored, up to 64 rows a chunk.
                    limit = whole if bit_exact or not others_in_rounds else PREFILL_CHUNK
                else:
                    limit = whole if budget is None else budget
                part = generation.prefill_part(limit)
                if part is None:  # the lane's KV already held the whole prompt
                    self.begin(generation)
                elif own_decode:
                    start = len(part.slot.kv_tokens)
                    rows = part.decode()
                    if generation.scores_prompt:
                        generation.take_prompt_rows(start, rows)
                    if generation.prefill_done:
                        self.begin(generation)
                elif self._opens_with(generation, part.tokens):
                    generation.open_with_prompt_tail(list(part.tokens))
                    opening.append(generation)
                else:
                    parts.append((generation, part))
                if part is not None and not own_decode:
                    budget = 0 if budget is None else max(budget - len(part.tokens), 0)
            except Exception as error:  # noqa: BLE001  # its own prompt's failure
                generation.fail(error)
        return parts, opening

    def _opens_with(self, generation: Generation, chunk: list[int]) -> bool:
        """Whether ``chunk`` ends the prompt's prefill and the first round can ride on it: not when the lane's
        controller still has to measure this machine's costs (on the prompt in the KV), nor when nothing is to be
        generated."""
        ends = len(generation.lane.target.kv_tokens) + len(chunk) >= len(generation.ctx) - 1
        return ends and not self._needs_calibration(generation) and generation.params.max_tokens > 0

    @staticmethod
    def _needs_calibration(generation: Generation) -> bool:
        """Whether the request's lane runs auto and has not yet measured this machine's costs for its readout."""
        lane = generation.lane
        return generation.controller is lane.auto and generation.readout.kind != lane.calibrated_for

    def _share_prefix(self, generation: Generation) -> None:
        """When another lane's KV holds more of this prompt than this lane's does (the same prompt for several
        choices, a shared system prompt), copy those cells instead of prefilling them again."""
        lane, want = generation.lane, generation.ctx[:-1]
        own = common_prefix(lane.target.kv_tokens, want)
        donor, best = None, own
        for other in self._lanes:
            if other is not lane:
                shared = common_prefix(other.target.kv_tokens, want)
                if shared > best:
                    donor, best = other, shared
        if donor is None or best < MIN_SHARED_PREFIX or not hasattr(lane.target, "copy_prefix_from"):
            return
        lane.target.copy_prefix_from(donor.target, best)
        if lane.draft is not None and donor.draft is not None:
            lane.draft.copy_prefix_from(donor.draft, common_prefix(donor.draft.kv_tokens, want[:best]))

    def begin(self, generation: Generation) -> None:
        """The prompt is in the target's KV: bring the drafters in step, calibrate once, and start the rounds."""
        try:
            generation.begin_rounds()
            lane = generation.lane
            if self._needs_calibration(generation):
                self._calibration.calibrate(lane, generation.ctx, generation.readout)
        except Exception as error:  # noqa: BLE001
            generation.lane.roll_back(generation.ctx)
            generation.fail(error)
            return
        generation.started()
        if generation.params.max_tokens == 0:  # the prompt scored, nothing to generate
            generation.finish("length")

