"""The kinds of content a request brings (text, audio, image, video) and asks back (text, audio)."""

from enum import StrEnum


class Modality(StrEnum):  # (a StrEnum: equal to its value, so JSON and request dicts carry plain strings)
    TEXT = "text"
    AUDIO = "audio"
    IMAGE = "image"
    VIDEO = "video"


MEDIA = (Modality.AUDIO, Modality.IMAGE, Modality.VIDEO)  # what an encoder turns into embeddings
