class GradScaler: pass
