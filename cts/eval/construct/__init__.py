"""Building a benchmark from one's own queries: fuse a search log's raw queries into intent
queries, blur them into the vague queries users type, each row checked before it is kept."""
