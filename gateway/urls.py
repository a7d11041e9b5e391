from django.urls import path, re_path

from gateway import views

urlpatterns = [
    path("v1/models", views.models),
    path("metrics", views.prometheus),
    re_path(r"^v1/(?P<path>.+)$", views.v1),
]
