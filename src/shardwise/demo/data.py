"""The demo's data set: labelled feature vectors in a few text files, classes imbalanced.

Every line is ``id,label,f1,...,fk``. The features are the label's centre plus noise, so a small
model can learn the classes; the classes are far from equal (the last one is about 2%). The
same seed writes the same bytes, so every node of a job can write its own copy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

CLASS_SHARES = (0.6, 0.25, 0.13, 0.02)
# The names write_dataset gives its files, and the temporaries a stopped run leaves behind.
WRITTEN = re.compile(r"_?part-\d+\.csv(\.\d+)?")


def write_dataset(folder: Path, samples: int, features: int = 8, files: int = 3,
                  seed: int = 0) -> list[Path]:
    """Write ``samples`` vectors over ``files`` files in ``folder``; return the files.

    >>> import tempfile
    >>> paths = write_dataset(Path(tempfile.mkdtemp()), 10, features=2, files=2)
    >>> [p.name for p in paths], paths[0].read_text().count("\\n")
    (['part-0.csv', 'part-1.csv'], 5)
    """
    rng = np.random.default_rng(seed)
    labels = rng.choice(len(CLASS_SHARES), size=samples, p=CLASS_SHARES)
    centres = rng.normal(0.0, 2.0, size=(len(CLASS_SHARES), features))
    values = centres[labels] + rng.normal(0.0, 1.0, size=(samples, features))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, part in enumerate(np.array_split(np.arange(samples), files)):
        lines = (",".join([str(i), str(labels[i]), *(f"{v:.4f}" for v in values[i])])
                 for i in part)
        path = folder / f"part-{number}.csv"
        # Written whole, then renamed: a reader never sees half a file, and two writers (two
        # "machines" sharing a disk) never mix their bytes. Names starting "_" are not loaded.
        temporary = folder / f"_{path.name}.{os.getpid()}"
        temporary.write_text("".join(f"{line}\n" for line in lines))
        temporary.replace(path)
        paths.append(path)
    return paths
