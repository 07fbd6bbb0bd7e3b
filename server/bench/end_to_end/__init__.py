"""``bench e2e``: the table a user of this CPU asks for: each Vigil configuration (int8, int4, n-gram speculation)
against the default, and Vigil against llama.cpp's ``llama-server``, at each concurrency, every server started
here on 127.0.0.1 and measured over streaming HTTP as ``bench serve --compare`` measures two."""
