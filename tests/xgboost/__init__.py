"""mltrace.xgboost: the XGBoost hook and its flight recorder."""
