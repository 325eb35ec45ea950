"""`cts view` (above cts/eval/run/): the Viewer over run directories (view), built of the runs
read (runs), the index and its queries (index), one sample (sample, with its trace's turns in
trace, the judge's quotes marked in highlight, every text cut by cuts) and the errors answered
(errors); the HTTP API and its static page (app, static/), the socket and server loop (serve)."""
