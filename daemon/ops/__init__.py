"""Operations: metrics, alerts, health endpoint and logging."""
