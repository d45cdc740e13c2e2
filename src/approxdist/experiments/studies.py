"""The five studies the presets reproduce: their reference, and their section of docs/studies.md.

Every report names its study here (`Study.cite`) and links its description in our docs
(`Study.link`), so a report read away from this repository still says what it reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError

#: the page that describes every study, relative to the repository's root
PAGE = "docs/studies.md"


@dataclass(frozen=True)
class Study:
    """One study: who, what, where; `key` is its anchor in `PAGE` (e.g. "seed000")."""

    key: str
    authors: str
    title: str  # in English; ours where the original is in Japanese only
    source: str  # where and when it appeared

    @property
    def number(self) -> str:
        """The study's number as the presets and docs write it: "seed 000"."""
        return f"seed {self.key.removeprefix('seed')}"

    @property
    def link(self) -> str:
        return f"{PAGE}#{self.key}"

    def cite(self) -> str:
        """`seed 000: Kan and Nakamura, "Evaluation of ..." (source)`."""
        return f'{self.number}: {self.authors}, "{self.title}" ({self.source})'


STUDIES: dict[str, Study] = {s.key: s for s in (
    Study("seed000", "M. Kan and D. Nakamura (Little Wing)",
          "Evaluation of Model Accuracy and Processing Performance when Applying Approximate "
          "Computing to Model Distributed Deep Learning",
          "paper in Japanese, undated; its latest reference is of 2022"),
    Study("seed001", "M. Yamazaki, A. Kasagi, T. Tabaru and T. Nakahira (Fujitsu Laboratories)",
          "Accelerating Deep Learning Framework with MPI",
          "Information Processing Society of Japan, 2016; in Japanese"),
    Study("seed002", "Hosoki, Nomura and Endo (Tokyo Institute of Technology)",
          "Bottleneck analysis and improvement of hybrid-parallel DNN training on GPU clusters",
          "IPSJ SIG Technical Report Vol. 2021-HPC-180 No. 9, 2021; in Japanese, title ours"),
    Study("seed003", "K. Yamasaki (NVIDIA)",
          "Distributed training basics",
          "lecture at the first Deep Learning Distributed Training Hackathon, 24 January 2019; "
          "slides in Japanese, title ours"),
    Study("seed004", "Y. Oyama (Tokyo Institute of Technology)",
          "Verifying the training accuracy of deep learning with low-precision types in "
          "large-scale parallel environments",
          "poster on AdaPrec, project EX17304, about 2017; in Japanese, title ours"),
)}


def get_study(key: str) -> Study:
    """The study `key` ("seed000" ... "seed004"); `ConfigError` listing the keys otherwise."""
    if key not in STUDIES:
        raise ConfigError(f"unknown study {key!r}; valid: {', '.join(STUDIES)}")
    return STUDIES[key]
