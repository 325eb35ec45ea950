"""The WebDancer deep-search agent: protocol rendering and parsing, the loop, search and visit
tools with their backends, the tool cache and traces."""
