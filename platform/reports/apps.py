from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "reports"

    def ready(self) -> None:
        from reports.services import reaudit_run_ended
        from runs.signals import run_ended_without_result

        def fail_waiting_reaudit(sender, *, run_id, error: str, **kwargs) -> None:
            reaudit_run_ended(run_id=run_id, error=error)

        run_ended_without_result.connect(fail_waiting_reaudit, dispatch_uid="reports.fail_waiting_reaudit")
