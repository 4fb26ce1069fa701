"""A small Django project for tests/e2e/test_django_admin_real.py: real ``celery beat``
processes over django-celery-beat, recording what they really send."""
