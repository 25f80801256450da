"""What differs between the two tasks, in one place: a small strategy object that
discovery, transform, planning, the manifest's readers and scan ask, instead of
branching on the task string.

Standard library only: the readers and the converter both import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from readers.choice import Choice
from readers.formats import FEATURE_LABEL, FEATURE_MASK, NPZ_LABELS, NPZ_MASKS


class Task(Choice):
    SEGMENTATION = "segmentation"
    CLASSIFICATION = "classification"

    @classmethod
    def _argument(cls) -> str:
        return "task"


@dataclass(frozen=True)
class TaskKind:
    """One task's answers.

    Attributes:
        task: the task.
        dense: y is per pixel (a class map decoded from a colour mask, stored as a mask)
            rather than one class index per image.
        target: the name of y in records, TFRecord features and TFDS metadata.
        npz_member: the NPZ member holding y.
        source_unit: what one source sample is ("pair": image + mask; "image").
        exif_transpose: apply an image's EXIF orientation when decoding it (only where no
            mask must stay pixel-aligned with the stored pixels).
        classes_from: where the class table comes from (for messages).
    """

    task: Task
    dense: bool
    target: str
    npz_member: str
    source_unit: str
    exif_transpose: bool
    classes_from: str

    def target_bytes(self, height: int, width: int, num_classes: int, *, onehot: bool, itemsize: int) -> int:
        """Bytes of one stored target (an int64 label, a class map, or one-hot planes)."""
        if not self.dense:
            return 8
        return height * width * (num_classes if onehot else itemsize)


SEGMENTATION = TaskKind(Task.SEGMENTATION, dense=True, target=FEATURE_MASK, npz_member=NPZ_MASKS, source_unit="pair",
                        exif_transpose=False, classes_from="the class table (class_colors.json)")
CLASSIFICATION = TaskKind(Task.CLASSIFICATION, dense=False, target=FEATURE_LABEL, npz_member=NPZ_LABELS,
                          source_unit="image", exif_transpose=True, classes_from="the class folders")

KINDS: dict[Task, TaskKind] = {k.task: k for k in (SEGMENTATION, CLASSIFICATION)}


def task_kind(task: "Task | str") -> TaskKind:
    """The strategy of `task`; an unknown task raises ValueError listing the valid ones."""
    return KINDS[Task.parse(task)]


__all__ = ["CLASSIFICATION", "KINDS", "SEGMENTATION", "Task", "TaskKind", "task_kind"]
