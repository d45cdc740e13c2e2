"""Everything that crosses the network: codecs, approximate channel, link emulation, collectives."""
