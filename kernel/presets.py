"""Workload presets: attention shapes of real video diffusion models (DESIGN.md section 8).

Head mix: about one third spatial heads, two thirds temporal heads, as Sparse
VideoGen reports for these models. Windows:
 - spatial heads attend their own frame and the neighbouring one
   (``window_frames=1``), Wan 2.1 720p adding the first-frame sink;
 - temporal heads attend, in every frame, the positions within one latent row
   of their own (``window_positions`` = the latent width in patches), i.e. the
   same spatial location and its horizontal neighbourhood.
``heads`` is the model's full head count; ``heads_per_chip`` what one chip sees
under the usual tensor parallelism (the tuned workload uses that count).
"""

from __future__ import annotations

import dataclasses

from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    layout: VideoLayout
    heads: int
    heads_per_chip: int
    head_dim: int
    dtype: str
    latent_width: int  # patches per latent row: the temporal heads' window
    first_frame_sink: bool = False
    notes: str = ""

    def pattern(self, heads: int | None = None) -> SparsityPattern:
        """The preset's pattern for ``heads`` heads (default: heads_per_chip)."""
        n = self.heads_per_chip if heads is None else heads
        spatial = max(1, round(n / 3))
        return SparsityPattern.grouped(
            self.layout,
            [
                (HeadPattern.spatial(1, self.first_frame_sink), spatial),
                (HeadPattern.temporal(self.latent_width, self.first_frame_sink), n - spatial),
            ],
        )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "wan2.1-720p",
            VideoLayout(21, 3600),
            40,
            10,
            128,
            "bfloat16",
            80,
            True,
            "Wan 2.1 14B at 1280x720, 81 frames; 10 heads per chip at TP4",
        ),
        Preset(
            "wan2.1-480p",
            VideoLayout(21, 1560),
            40,
            12,
            128,
            "bfloat16",
            52,
            False,
            "Wan 2.1 at 832x480; 12 heads for the 1.3B model",
        ),
        Preset(
            "hunyuan-720p",
            VideoLayout(33, 3600, 256, "suffix"),
            24,
            24,
            128,
            "bfloat16",
            80,
            False,
            "HunyuanVideo 720p, 129 frames, 256 text tokens after the video",
        ),
        Preset(
            "cogvideox1.5",
            VideoLayout(11, 4080, 226, "prefix"),
            48,
            48,
            64,
            "bfloat16",
            85,
            False,
            "CogVideoX 1.5 at 1360x768, text prefix",
        ),
        Preset(
            "cogvideox-5b",
            VideoLayout(13, 1350, 226, "prefix"),
            48,
            48,
            64,
            "bfloat16",
            45,
            False,
            "CogVideoX 5B at 720x480, text prefix",
        ),
        Preset(
            "cpu-demo",
            VideoLayout(8, 512),
            4,
            4,
            64,
            "float32",
            32,
            False,
            "small enough to tune on a laptop CPU in about a minute",
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
