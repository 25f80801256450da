"""Annotations that are not mask images: COCO, YOLO-seg, LabelMe, CVAT, instance-mask
folders and Kaggle RLE CSV. Readers list samples whose `SourceSample.annotation` holds
their own shapes; workers rasterize them at the source image's size
(`registry.rasterize`), and the usual transform follows (docs/LAYOUTS.md)."""
