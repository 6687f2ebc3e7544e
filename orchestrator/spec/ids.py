"""The shape of a job id, for whoever takes one from a machine it does not trust.

A job id is the spec's `name` (`model._NAME_RE`: a lowercase letter, then up to 62 lowercase
letters, digits and '-') followed by '-' and 6 hex digits
(`control.process.controllers.new_job_id`).
Such an id names a folder (`jobs/<id>`, `keys/<id>`, a hand-over kit) safely: no '/', no '.',
no '..', no space and no control character can be in it.
"""

from __future__ import annotations

import re

from orchestrator.spec.model import _NAME_RE

JOB_ID_RE = re.compile(rf"(?:{_NAME_RE.pattern})-[0-9a-f]{{6}}")


def is_job_id(text: object) -> bool:
    """Whether `text` is a string of the job-id shape (see the module docstring). Pure."""
    return isinstance(text, str) and JOB_ID_RE.fullmatch(text) is not None
