"""Search and visit backends: local corpus, Serper, SearXNG, retrieval server, HTTP fetch."""
