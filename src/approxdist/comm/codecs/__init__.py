"""Wire codecs: fp32 tensors <-> packed bytes, chosen by spec string (seeds 000 and 004)."""

from approxdist.comm.codecs.base import Codec, Payload
from approxdist.comm.codecs.spec import CODECS, DEFAULT_SPECS, codec_specs_help, get_codec

__all__ = ["CODECS", "DEFAULT_SPECS", "Codec", "Payload", "codec_specs_help", "get_codec"]
