"""The LLM roles of the protocol: clarifier, user answerer, rewriter, coverage judge, nugget
builder, question-type classifier. Each is a prompt template, an output schema and one call
through a `serving` engine."""
