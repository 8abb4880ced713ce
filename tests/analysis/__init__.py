"""mltrace.analysis: the analysis layer under the plugins and its cache."""
